#!/usr/bin/env bash
# run 32f: run 32e with 128 talker slots (and 128 requests in flight), to see whether the open
# loop's capacity is the 64 slots
O=$OUT; export OUT=/tmp/r32f; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export OPEN_TIMEOUT=70 READY_S=300
{
  echo "== cc $(date +%T)"
  SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 128" LEVELS="64 128" RATES="40 50 60" \
    STAGES=service TAG=cc REPO_ARGS="$R" timeout 550 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -40
grep -h "fused pipeline gpu" $OUT/server_cc.log | tail -1 | cut -c1-700
tar czf $O/r32f.tar.gz -C /tmp r32f
