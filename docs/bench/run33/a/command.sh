#!/usr/bin/env bash
# run 33a: main c9ecabd (StatePool.open without the blocking copy, the fused pipeline's codec
# audio copied behind the next step) on run 32f's configuration (128 slots): open loop at 50, 60
# and 70 req/s of 4-s clips, then py-spy of the tts stub and the engine worker at 60 req/s
O=$OUT; export OUT=/tmp/r33a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export OPEN_TIMEOUT=120 READY_S=300 LEVELS="" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
{
  echo "== b128 $(date +%T)"
  RATES="50 60 70" PROFILE_RATE=60 PROFILE_S=12 STAGES=service TAG=b128 REPO_ARGS="$R" timeout 520 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "^ *[0-9]* *[0-9]* *[0-9]* .*pyspy" | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -40
grep -h "fused pipeline gpu" $OUT/server_b128.log | tail -1 | cut -c1-700
tar czf $O/r33a.tar.gz -C /tmp r33a
