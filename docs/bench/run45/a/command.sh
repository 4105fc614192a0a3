#!/usr/bin/env bash
# run 45a: A/B in one call (scripts/gpu_ab_bench.sh) on a fresh machine: A = the admission hold
# of run 44 (new requests held up to 30 ms while at least 32 rows decode: --native-admit-hold-ms
# 30 --native-admit-hold-requests 8 --native-admit-hold-min-rows 32), B = the same with each
# finished stream's last frames decoded in one padded codec call (--fused-pad-final true, at
# 99b052e; the setting became --fused-finish pad);
# 64 streams, closed loop, 200-frame requests, 30-s levels in ORDER (default B A A B, as far as
# DEADLINE_S allows), after an unmeasured 15-s level on each. A_ARGS / B_ARGS / ORDER from the
# environment replace these (the later calls of run 45 do). Everything is packed into all.tgz;
# the per-request JSONs are left out (their CSVs hold the same rows).
set -u
export PYTHONUNBUFFERED=1
HOLD="--native-admit-hold-ms 30 --native-admit-hold-requests 8 --native-admit-hold-min-rows 32"
A_ARGS=${A_ARGS-$HOLD}
B_ARGS=${B_ARGS-"$HOLD --fused-pad-final true"}
ORDER=${ORDER:-"B A A B"}
R=$OUT; O=/tmp/o; rm -rf $O; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
(for _ in $(seq 1 60); do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu,power.draw --format=csv,noheader)"; sleep 10; done > $O/gpu_mem.txt) &
mem=$!
echo "start $(date +%T) ORDER=$ORDER A_ARGS=$A_ARGS B_ARGS=$B_ARGS" > $O/console.txt
OUT=$O DEADLINE_S=${DEADLINE_S:-545} ORDER=$ORDER A_ARGS=$A_ARGS B_ARGS=$B_ARGS \
  bash scripts/gpu_ab_bench.sh >> $O/console.txt 2>&1
echo "ab exit $? $(date +%T)" >> $O/console.txt
kill $mem 2>/dev/null
rm -f $O/ab_*.json
gzip -f $O/server_*.log
tar czf "$R/all.tgz" -C $O .
ls -l "$R"
tail -30 $O/console.txt | cut -c1-300
for s in A B; do echo "== $s"; cut -c1-600 $O/gpu_busy_$s.txt | head -30; done
# the new histograms of each level (a stream's time before its first frame and after its last)
for f in "$O"/metrics_ab_*_after.txt; do
  echo "== $(basename "$f")"; grep -E "^qwen3_tts_fused_(first_frame|tail)_seconds_(sum|count)" "$f"
done
