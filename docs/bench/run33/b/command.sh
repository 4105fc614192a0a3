#!/usr/bin/env bash
# run 33b: where the GPU's time goes at 50-70 req/s (the engine's gpu_ms: CUDA event pairs per
# step bucket, prefill and codec call, in the server's 30-s stats lines), run 33a's configuration
# (128 slots, buckets 1,8,32,64,128); then (same machine) with a 96-row decode bucket added
O=$OUT; export OUT=/tmp/r33b; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export OPEN_TIMEOUT=120 READY_S=300 LEVELS="" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
{
  echo "== b128 $(date +%T)"
  RATES="50 60 70" STAGES=service TAG=b128 REPO_ARGS="$R --native-batch-buckets 1,8,32,64,128" timeout 320 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  sleep 25; grep -h "fused pipeline gpu" $OUT/server_b128.log | tail -1 | cut -c1-2000
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 3
  echo "== b96 $(date +%T)"
  RATES="60 70" STAGES=service TAG=b96 REPO_ARGS="$R --native-batch-buckets 1,8,32,64,96,128" timeout 170 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  sleep 25; grep -h "fused pipeline gpu" $OUT/server_b96.log | tail -1 | cut -c1-2000
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -40
tar czf $O/r33b.tar.gz -C /tmp r33b
