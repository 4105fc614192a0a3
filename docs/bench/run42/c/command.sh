#!/usr/bin/env bash
# run 42c: main at 64 streams, closed loop, run 39c's configuration ("main", the goal's
# configuration) and the same with 25-frame chunks after the ramp ("c25": --chunk-frames 25),
# two servers started side by side and measured in turn, each only once both are loaded (A waits
# for B's READY_FILE, B for A's DONE). Outputs into $OUT, packed into all.tgz at the end.
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export READY_S=420 GATE_S=300 SERVICE_ARGS="--duration 30 --warmup 1" STAGES=service LEVELS="64" RATES=""
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
echo "start $(date +%T)" > $OUT/console.txt
source scripts/gpu_env.sh >> $OUT/console.txt 2>&1
echo "env done $(date +%T)" >> $OUT/console.txt
(for i in $(seq 1 50); do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu,power.draw --format=csv,noheader)"; sleep 10; done > $OUT/gpu_mem.txt) &
mem=$!
rm -f /tmp/main.ready /tmp/main.done /tmp/c25.ready /tmp/c25.done
(TAG=main PORT=18000 REPO=/tmp/repo_main READY_FILE=/tmp/main.ready DONE=/tmp/main.done GATE=/tmp/c25.ready REPO_ARGS="$R" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_main.txt 2>&1; echo "main exit $? $(date +%T)" >> $OUT/console.txt) &
a=$!
sleep 10
(TAG=c25 PORT=18100 REPO=/tmp/repo_c25 READY_FILE=/tmp/c25.ready DONE=/tmp/c25.done GATE=/tmp/main.done REPO_ARGS="$R --chunk-frames 25" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_c25.txt 2>&1; echo "c25 exit $? $(date +%T)" >> $OUT/console.txt) &
b=$!
wait $a $b
kill $mem 2>/dev/null
for t in main c25; do
  python scripts/gpu_busy.py $OUT/server_$t.log > $OUT/gpu_busy_$t.txt 2>&1
  echo "== $t"; grep -v "^ *$" $OUT/console_$t.txt | grep "ready\|gate\|^ *64 " | cut -c1-250
done
grep -v "^transformers\|^torch" $OUT/console.txt
for t in main c25; do echo "$t loaded: $(grep -o '^I[0-9]* [0-9:]*.*successfully loaded .tts.' $OUT/server_$t.log | cut -c7-14)"; done
cd $OUT; gzip -f server_*.log; tar czf /tmp/all.tgz --exclude console.txt .; find . -type f ! -name console.txt -delete; mv /tmp/all.tgz .
