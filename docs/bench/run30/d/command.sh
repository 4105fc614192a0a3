#!/usr/bin/env bash
# run 30d: two GPUs again, as 30a, on the code with the prompt projected on the GPU, 4 torch
# threads per engine worker and ride-alongs 'due' (cc9e007, d095715, fb4b99b: the defaults); the recommended configuration without the codec's compile.
# A 1-GPU and a 2-GPU server (scripts/gpu_scaling_bench.sh), py-spy of server B at 40 req/s.
O=$OUT
R="--native-compile true --native-kernels triton --native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32"
PACK=$O/r30d.tar.gz OUT=/tmp/r30d RATES_A="16 20 24 28" RATES_B="32 40 48 56" LEVELS_B="64 128" \
  OPEN_ARGS="--duration 20 --warmup 2 --streams 64" CLOSED_ARGS="--duration 10 --warmup 1" \
  PROFILE_RATE=40 PROFILE_S=15 READY_S=240 REPO_ARGS="$R" timeout 560 bash scripts/gpu_scaling_bench.sh > /tmp/r30d_console.txt 2>&1
echo "exit $?" >> /tmp/r30d_console.txt
mkdir -p /tmp/r30d; cp /tmp/r30d_console.txt /tmp/r30d/console.txt
pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
grep -v "^ *$" /tmp/r30d/console.txt | grep -v "mean     p50" | tail -40
tar czf $O/r30d.tar.gz -C /tmp r30d
