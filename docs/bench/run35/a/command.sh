#!/usr/bin/env bash
# run 35a: main 0623cea on the H200 (the device tool's one-GPU kind now): chunk_frames 12 against
# 25 (the default of the recommended configuration), run 34's configuration otherwise (128 slots),
# one server after the other on one machine (the second's compile cache warm). Open loop, 4-s
# clips, one run per rate with a metrics snapshot after each, rates in the same order on both.
O=$OUT; export OUT=/tmp/r35a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
cat $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export PER_RATE=1 OPEN_TIMEOUT=60 READY_S=300 LEVELS="" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
T0=$(date +%s)
{
  echo "== chunk12 $(date +%T)"
  RATES="60 70 50" STAGES=service TAG=chunk12 REPO_ARGS="$R --chunk-frames 12" timeout 390 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 3
  left=$(( 578 - ($(date +%s) - T0) ))
  echo "== chunk25 $(date +%T) left ${left}s"
  RATES="60 70 50" STAGES=service TAG=chunk25 REPO_ARGS="$R --chunk-frames 25" timeout $left bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -45
for t in chunk12 chunk25; do grep -h "fused pipeline gpu" $OUT/server_$t.log 2>/dev/null | tail -1 | cut -c1-400; done
gzip -f $OUT/server_*.log 2>/dev/null
tar czf $O/r35a.tar.gz -C /tmp r35a
