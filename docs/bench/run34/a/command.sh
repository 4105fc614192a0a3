#!/usr/bin/env bash
# run 34a: main 7cbd552, run 33a's configuration (128 slots): the first chunk's last frame taken
# from the unread step on the device (fused_first_on_device, the default) against the host path
# (false), one server after the other on one machine (the second's compile cache warm). Open
# loop, 4-s clips, one run per rate with a metrics snapshot after each (device time per launch).
O=$OUT; export OUT=/tmp/r34a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export PER_RATE=1 OPEN_TIMEOUT=60 READY_S=280 LEVELS="" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
T0=$(date +%s)
{
  echo "== dev $(date +%T)"
  RATES="60 70 50" STAGES=service TAG=dev REPO_ARGS="$R" timeout 390 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 3
  left=$(( 575 - ($(date +%s) - T0) ))
  echo "== host $(date +%T) left ${left}s"
  RATES="60 70" STAGES=service TAG=host REPO_ARGS="$R --fused-first-on-device false" timeout $left bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -45
for t in dev host; do grep -h "fused pipeline gpu" $OUT/server_$t.log 2>/dev/null | tail -1 | cut -c1-600; done
gzip -f $OUT/server_*.log 2>/dev/null
tar czf $O/r34a.tar.gz -C /tmp r34a
