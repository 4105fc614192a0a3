#!/usr/bin/env bash
# run 44c, on 44a-b's machine, still warm: A = 44a's B (the hold, min rows 32), B = the same with
# 25-frame chunks after the ramp (--chunk-frames 25); levels A B B A B A. Its console.txt's
# 'start' line names run 44a's order: that echo reads ORDER from the environment, unset here.
# configuration, no admission hold), B = the same with new requests held up to 30 ms and admitted
# together, only while at least 32 rows decode (--native-admit-hold-ms 30
# --native-admit-hold-requests 8 --native-admit-hold-min-rows 32); 64 streams, closed loop,
# 200-frame requests, 30-s levels in the order B A A B (as far as DEADLINE_S allows), after an
# unmeasured 15-s level on each. Everything is packed into all.tgz (8 files come back at most);
# the per-request JSONs are left out (their CSVs hold the same rows).
set -u
H="--native-admit-hold-ms 30 --native-admit-hold-requests 8 --native-admit-hold-min-rows 32"
export PYTHONUNBUFFERED=1
R=$OUT; O=/tmp/o; rm -rf $O; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
(for _ in $(seq 1 60); do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu,power.draw --format=csv,noheader)"; sleep 10; done > $O/gpu_mem.txt) &
mem=$!
echo "start $(date +%T) ORDER=${ORDER:-B A A B}" > $O/console.txt
OUT=$O DEADLINE_S=${DEADLINE_S:-545} ORDER=${ORDER:-"A B B A B A"} A_ARGS="$H" \
  B_ARGS="$H --chunk-frames 25" \
  bash scripts/gpu_ab_bench.sh >> $O/console.txt 2>&1
echo "ab exit $? $(date +%T)" >> $O/console.txt
kill $mem 2>/dev/null
rm -f $O/ab_*.json
gzip -f $O/server_*.log
tar czf "$R/all.tgz" -C $O .
ls -l "$R"
tail -30 $O/console.txt | cut -c1-300
for s in A B; do echo "== $s"; cut -c1-600 $O/gpu_busy_$s.txt | head -30; done
