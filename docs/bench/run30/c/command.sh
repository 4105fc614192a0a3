#!/usr/bin/env bash
# run 30c (same machine as 30b): fused_ride_along due with 30b's "new" defaults, as its arms;
# then scripts/prompt_timing.py (1.7B frontend: ms per build with the projection on the CPU and
# on the GPU, and the largest difference of their rows)
O=$OUT; export OUT=/tmp/r30c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton"
export SERVICE_ARGS="--duration 12 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=200 LEVELS="1 32 64" RATES="20 30 40"
{
  echo "== ride $(date +%T)"
  STAGES=service TAG=ride REPO_ARGS="$R --fused-ride-along due" timeout 300 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 2
  echo "== prompt timing $(date +%T)"
  source scripts/gpu_env.sh > /dev/null 2>&1
  timeout 120 python scripts/prompt_timing.py --checkpoint /tmp/ckpt-1.7b-customvoice --builds 200 2>&1 | grep -v "^\[transformers\]"
  timeout 60 python scripts/prompt_timing.py --checkpoint /tmp/ckpt-1.7b-customvoice --builds 200 --threads 1 2>&1 | grep -v "^\[transformers\]"
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -30
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -2 | cut -c1-700
tar czf $O/r30c.tar.gz -C /tmp r30c
