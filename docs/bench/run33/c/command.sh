#!/usr/bin/env bash
# run 33c: the prefill's talker GEMMs on the Triton kernels (native_prefill_kernel_rows 256, the
# default) on run 33a's configuration (128 slots): open loop at 50, 60 and 70 req/s and the GPU
# time per launch kind (gpu_ms in the 30-s stats line); then (same machine) the same with
# --native-prefill-kernel-rows 0 (the torch blocks) at 60 req/s
O=$OUT; export OUT=/tmp/r33c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export OPEN_TIMEOUT=120 READY_S=300 LEVELS="" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
{
  echo "== pk256 $(date +%T)"
  RATES="50 60 70" STAGES=service TAG=pk256 REPO_ARGS="$R" timeout 340 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  sleep 30; grep -h "fused pipeline gpu" $OUT/server_pk256.log | tail -1 | cut -c1-2500
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 3
  echo "== pk0 $(date +%T)"
  RATES="60" STAGES=service TAG=pk0 REPO_ARGS="$R --native-prefill-kernel-rows 0" timeout 160 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  grep -h "fused pipeline gpu" $OUT/server_pk0.log | tail -1 | cut -c1-2500
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -40
tar czf $O/r33c.tar.gz -C /tmp r33c
