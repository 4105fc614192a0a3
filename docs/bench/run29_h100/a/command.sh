#!/usr/bin/env bash
# run 29a: codec compiled (bf16) vs not, both with the Triton kernels, same H100
O=$OUT; export OUT=/tmp/r29a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton"
export LEVELS="1 32 64" SERVICE_ARGS="--duration 12 --warmup 1" RATES="20 30 40" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=240
run() {  # TAG, extra repo args
  echo "== $1 $(date +%T)"
  STAGES=service TAG=$1 REPO_ARGS="$R $2" timeout "${3:-330}" bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 2
}
{
  run cc "--codec-compile true" 345
  LEVELS="1 64" RATES="20 30" run plain "" 205
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | tail -60
tar czf $O/r29a.tar.gz -C /tmp r29a
