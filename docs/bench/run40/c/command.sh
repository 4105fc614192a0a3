#!/usr/bin/env bash
# run 40c: the codec's graph beside the 64-row frame step on a second CUDA stream
# (scripts/overlap_probe.py), and the channels-last codec's GPU parity (graphs and layout against
# the reference eager step, bf16 and fp32).
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== overlap $(date +%T)"
  timeout 220 python scripts/overlap_probe.py --preset 1.7b-customvoice --rows 64 --codec 16:16 32:16 8:16 32:2 --json $OUT/overlap.json
  echo "exit $? $(date +%T)"
  echo "== parity bf16 $(date +%T)"
  timeout 120 python scripts/check_stateful_graphs.py --preset 1.7b-customvoice --dtype bfloat16 --channels-last --batch 1 8 32 --frames 2 16 25
  echo "exit $? $(date +%T)"
  echo "== parity fp32 $(date +%T)"
  timeout 100 python scripts/check_stateful_graphs.py --preset 1.7b-customvoice --dtype float32 --channels-last --batch 1 8 --frames 2 25
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -60 | cut -c1-300
