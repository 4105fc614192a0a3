#!/usr/bin/env bash
# run 32c: run 31e's measurement (recommended configuration, compiled codec) with
# native_kernels auto and the overlapped engine loop, open loop up to 60 req/s
O=$OUT; export OUT=/tmp/r32c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=300 LEVELS="1 32 64" RATES="20 30 40 50 60"
{
  echo "== cc $(date +%T)"
  STAGES=service TAG=cc REPO_ARGS="$R" timeout 540 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -30
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -2 | cut -c1-700
grep -h "native_kernels" $OUT/server_*.log | head -2 | cut -c1-300
tar czf $O/r32c.tar.gz -C /tmp r32c
