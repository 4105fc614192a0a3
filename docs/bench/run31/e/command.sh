#!/usr/bin/env bash
# run 31e: 30e/30f's command on the tiles of run 31b and the flash-decoding talker attention
# (run 31d), plus py-spy of the tts stub and the engine worker at 40 req/s (PROFILE_RATE)
O=$OUT; export OUT=/tmp/r31e; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton --codec-compile true"
export PROFILE_RATE=40 PROFILE_S=12 SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=300 LEVELS="1 32 64" RATES="20 30 40"
{
  echo "== cc $(date +%T)"
  STAGES=service TAG=cc REPO_ARGS="$R" timeout 530 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "^ *[0-9]* *[0-9]* *[0-9]* .*pyspy" | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -30
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -2 | cut -c1-700
tar czf $O/r31e.tar.gz -C /tmp r31e
