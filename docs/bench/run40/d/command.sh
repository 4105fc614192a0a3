#!/usr/bin/env bash
# run 40d: (1) the channels-last codec graphs with cuDNN's timed algorithm choice at capture
# (uncompiled, bf16: run 40c's 10x-slow case); (2) end to end with finer prefill buckets and the
# prefill's kernels at <= 64 rows (main), run 39c's configuration otherwise: closed loop at 1 and
# 64 streams of 200 frames, open loop at 70 and 80 req/s (4-s clips).
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export PER_RATE=1 OPEN_TIMEOUT=60 READY_S=330 SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
{
  source scripts/gpu_env.sh
  echo "== parity bf16 $(date +%T)"
  timeout 80 python scripts/check_stateful_graphs.py --preset 1.7b-customvoice --dtype bfloat16 --channels-last --batch 1 8 32 --frames 2 16 25
  echo "exit $? $(date +%T)"
  echo "== e2e $(date +%T)"
  LEVELS="1 64" RATES="70 80" STAGES=service TAG=e2e REPO_ARGS="$R" timeout 440 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *$" | grep -v "^open loop;\|level    ok" | tail -45 | cut -c1-300
grep -h "fused pipeline gpu" $OUT/server_e2e.log 2>/dev/null | tail -1 | cut -c1-400
gzip -f $OUT/server_*.log 2>/dev/null
