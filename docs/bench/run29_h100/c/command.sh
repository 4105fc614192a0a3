#!/usr/bin/env bash
# run 29c: the fused pipeline with the stateful codec compiled (one compile for every slot),
# then (time permitting) the same with a 1-frame first chunk
O=$OUT; export OUT=/tmp/r29c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton --codec-compile true"
export SERVICE_ARGS="--duration 12 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=330
run() {  # TAG, extra repo args, limit s
  echo "== $1 $(date +%T) limit $3 s"
  STAGES=service TAG=$1 REPO_ARGS="$R $2" timeout "$3" bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 2
}
{
  LEVELS="1 32 64" RATES="20 30 40" run cc "--first-chunk-frames 2" 420
  left=$((575 - SECONDS))
  if [ $left -gt 120 ]; then LEVELS="1" RATES="20 30" run fc1 "--first-chunk-frames 1" $left; else echo "fc1 skipped: $left s left"; fi
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | tail -45
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -4 | cut -c1-700
tar czf $O/r29c.tar.gz -C /tmp r29c
