#!/usr/bin/env bash
# Ran on 2976bee (the working tree of that commit; the 'start' line of console.txt names 6c916a7 because the device machine's copy of .git is not the checkout's).
# run 43a: A/B in one call (scripts/gpu_ab_bench.sh): A = main (run 39c's configuration), B = the
# same with --native-admit-after-step true; 64 streams, closed loop, 200-frame requests, 30-s
# levels in the order A B B A. The compile caches come back as compile.tgz (carried later as
# .gpu-cache/compile.tgz). Everything else is packed into all.tgz (8 files come back at most).
set -u
export PYTHONUNBUFFERED=1
R=$OUT; O=/tmp/o; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > $O/gpu.txt
(for i in $(seq 1 60); do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,clocks.sm,temperature.gpu,power.draw --format=csv,noheader)"; sleep 10; done > $O/gpu_mem.txt) &
mem=$!
echo "start $(date +%T) $(git log --oneline -1 | cut -c1-60)" > $O/console.txt
OUT=$O DEADLINE_S=${DEADLINE_S:-535} PACK_CACHE=1 A_ARGS="" B_ARGS="--native-admit-after-step true" \
  bash scripts/gpu_ab_bench.sh >> $O/console.txt 2>&1
echo "ab exit $? $(date +%T)" >> $O/console.txt
kill $mem 2>/dev/null
[ -f $O/compile.tgz ] && mv $O/compile.tgz $R/
gzip -f $O/server_*.log
tar czf $R/all.tgz -C $O .
ls -l $R
tail -30 $O/console.txt | cut -c1-300
for s in A B; do echo "== $s"; cut -c1-600 $O/gpu_busy_$s.txt | head -30; done
