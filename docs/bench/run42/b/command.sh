#!/usr/bin/env bash
# run 42b: main (21342b2) at 64 streams, closed loop, run 39c's configuration ("main": the goal's
# configuration, again on another machine) and the same with the codec's batches up to 64
# streams ("cb64": --codec-max-batch-size 64), two servers started side by side and measured in
# turn; then the code predictor's code parity at 64 rows over 2,000 frames (kernels against the
# torch blocks and fp32) and the engine's graphs-vs-eager greedy check. Outputs into $OUT.
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export READY_S=420 GATE_S=300 SERVICE_ARGS="--duration 30 --warmup 1" STAGES=service LEVELS="64" RATES=""
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
echo "start $(date +%T)" > $OUT/console.txt
source scripts/gpu_env.sh >> $OUT/console.txt 2>&1
echo "env done $(date +%T)" >> $OUT/console.txt
(for i in $(seq 1 40); do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; sleep 10; done > $OUT/gpu_mem.txt) &
mem=$!
rm -f /tmp/gate_main
(TAG=main PORT=18000 REPO=/tmp/repo_main DONE=/tmp/gate_main REPO_ARGS="$R" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_main.txt 2>&1; echo "main exit $? $(date +%T)" >> $OUT/console.txt) &
a=$!
sleep 10
(TAG=cb64 PORT=18100 REPO=/tmp/repo_cb64 GATE=/tmp/gate_main REPO_ARGS="$R --codec-max-batch-size 64" \
  bash scripts/gpu_e2e_bench.sh > $OUT/console_cb64.txt 2>&1; echo "cb64 exit $? $(date +%T)" >> $OUT/console.txt) &
b=$!
wait $a $b
kill $mem 2>/dev/null
for t in main cb64; do python scripts/gpu_busy.py $OUT/server_$t.log > $OUT/gpu_busy_$t.txt 2>&1; done
left=$((570 - $(date +%s) + T0))
echo "parity $(date +%T) left ${left}s" >> $OUT/console.txt
if [ "$left" -gt 60 ]; then
  P="python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --batch-buckets 64"
  timeout $((left - 35)) $P --cp-parity 2000 --json $OUT/parity.json > $OUT/parity.txt 2>&1
  echo "parity exit $? $(date +%T)" >> $OUT/console.txt
fi
left=$((570 - $(date +%s) + T0))
if [ "$left" -gt 30 ]; then
  timeout $((left - 5)) python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json > $OUT/check.txt 2>&1
  echo "check exit $? $(date +%T)" >> $OUT/console.txt
fi
for t in main cb64; do
  echo "== $t"; grep -v "^ *$" $OUT/console_$t.txt | tail -4 | cut -c1-250; cut -c1-400 $OUT/gpu_busy_$t.txt
done
cat $OUT/console.txt | grep -v "^transformers\|^torch"
tail -3 $OUT/check.txt 2>/dev/null; python -c "import json; print(json.load(open('$OUT/parity.json')).get('cp_parity'))" 2>/dev/null
cd $OUT; gzip -f server_*.log; tar czf /tmp/all.tgz --exclude console.txt .; find . -type f ! -name console.txt -delete; mv /tmp/all.tgz .
