#!/usr/bin/env bash
# run 42d: 42c's two servers in the other order: "c25" (--chunk-frames 25) measured first, "main"
# (the goal's configuration) second, each only once both are loaded; outputs in /tmp/r42d, packed
# into $OUT/all.tgz at the end, each level's line in $OUT/console.txt as soon as it is measured.
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export READY_S=400 GATE_S=250 SERVICE_ARGS="--duration 30 --warmup 1" STAGES=service LEVELS="64" RATES=""
O=$OUT; export OUT=/tmp/r42d; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
echo "start $(date +%T)" > $O/console.txt
source scripts/gpu_env.sh >> $OUT/env.txt 2>&1
echo "env done $(date +%T)" >> $O/console.txt
(for i in $(seq 1 50); do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu,power.draw --format=csv,noheader)"; sleep 10; done > $OUT/gpu_mem.txt) &
mem=$!
rm -f /tmp/main.ready /tmp/main.done /tmp/c25.ready /tmp/c25.done
(TAG=c25 PORT=18100 REPO=/tmp/repo_c25 READY_FILE=/tmp/c25.ready DONE=/tmp/c25.done GATE=/tmp/main.ready REPO_ARGS="$R --chunk-frames 25" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_c25.txt 2>&1; echo "c25 exit $? $(date +%T)" >> $O/console.txt
  grep "ready\|gate\|^ *64 " $OUT/console_c25.txt >> $O/console.txt) &
a=$!
sleep 10
(TAG=main PORT=18000 REPO=/tmp/repo_main READY_FILE=/tmp/main.ready DONE=/tmp/main.done GATE=/tmp/c25.done REPO_ARGS="$R" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_main.txt 2>&1; echo "main exit $? $(date +%T)" >> $O/console.txt
  grep "ready\|gate\|^ *64 " $OUT/console_main.txt >> $O/console.txt) &
b=$!
wait $a $b
kill $mem 2>/dev/null
for t in c25 main; do echo "$t loaded: $(grep -o '^I[0-9]* [0-9:]*.*successfully loaded .tts.' $OUT/server_$t.log | cut -c7-14)" >> $O/console.txt; done
cat $O/console.txt
cd $OUT; gzip -f server_*.log; tar czf $O/all.tgz .
