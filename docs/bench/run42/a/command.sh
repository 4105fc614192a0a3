#!/usr/bin/env bash
# run 42a: main (61ae30a) at 64 streams, closed loop, run 39c's configuration, two servers started
# side by side on one machine and measured in turn: "deep" with native_deep_overlap_rows 32 (two
# decode steps unread from 32 active rows), then "main" with the default (one). The GPU's busy
# share, its gaps by transition and the loop's phases from each server's stats lines
# (scripts/gpu_busy.py). Outputs straight into $OUT.
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export READY_S=420 GATE_S=300 SERVICE_ARGS="--duration 30 --warmup 1" STAGES=service LEVELS="64" RATES=""
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
echo "start $(date +%T)" > $OUT/console.txt
source scripts/gpu_env.sh >> $OUT/console.txt 2>&1
echo "env done $(date +%T)" >> $OUT/console.txt
rm -f /tmp/gate_deep
(TAG=deep PORT=18000 REPO=/tmp/repo_deep DONE=/tmp/gate_deep REPO_ARGS="$R --native-deep-overlap-rows 32" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_deep.txt 2>&1; echo "deep exit $? $(date +%T)" >> $OUT/console.txt) &
sleep 10
(TAG=main PORT=18100 REPO=/tmp/repo_main GATE=/tmp/gate_deep REPO_ARGS="$R" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_main.txt 2>&1; echo "main exit $? $(date +%T)" >> $OUT/console.txt) &
wait
for t in deep main; do
  python scripts/gpu_busy.py $OUT/server_$t.log > $OUT/gpu_busy_$t.txt 2>&1
  echo "== $t"; grep -v "^ *$" $OUT/console_$t.txt | tail -6 | cut -c1-250; cut -c1-400 $OUT/gpu_busy_$t.txt
done
cat $OUT/console.txt
gzip -f $OUT/server_*.log
