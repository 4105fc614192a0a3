#!/usr/bin/env bash
# run 34d: main f0a6403, run 33a's configuration (128 slots): the native engine's loop on a thread
# of its own (native_loop_thread, the new default) against the loop in the executor (false, the
# code of run 34a's "dev"), one server after the other on one machine (the second's compile
# cache warm). Open loop, 4-s clips, one run per rate with a metrics snapshot after each.
O=$OUT; export OUT=/tmp/r34d; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export PER_RATE=1 OPEN_TIMEOUT=60 READY_S=280 LEVELS="" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
T0=$(date +%s)
{
  echo "== thread $(date +%T)"
  RATES="60 70 50" STAGES=service TAG=thread REPO_ARGS="$R" timeout 380 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 3
  left=$(( 505 - ($(date +%s) - T0) ))
  echo "== executor $(date +%T) left ${left}s"
  RATES="60 70" STAGES=service TAG=executor REPO_ARGS="$R --native-loop-thread false" timeout $left bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -45
for t in thread executor; do grep -h "fused pipeline gpu" $OUT/server_$t.log 2>/dev/null | tail -1 | cut -c1-400; done
gzip -f $OUT/server_*.log 2>/dev/null
tar czf $O/r34d.tar.gz -C /tmp r34d
