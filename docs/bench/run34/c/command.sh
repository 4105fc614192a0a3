#!/usr/bin/env bash
# run 34c: scripts/stream_overlap_probe.py (34b's probe stopped on a bug before measuring)
source scripts/gpu_env.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
timeout 400 python scripts/stream_overlap_probe.py --preset 1.7b-customvoice --batch 32 64 \
  --calls 2x2 8x25 32x25 --compile --codec-compile --json $OUT/stream_overlap.json > $OUT/stream_overlap.txt 2>&1
echo "probe exit $?"; grep -v "^W1\|warn" $OUT/stream_overlap.txt | tail -30
