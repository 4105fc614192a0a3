#!/usr/bin/env bash
# run 36c: deeper K tiles for the code predictor's GEMMs (the K loop is one memory latency per K
# tile): scripts/kernel_sweep.py --cold --configs deep on the five-kernels-per-layer path, and
# scripts/cp_probe.py's tile, grid and prefetch variants of the persistent kernel.
O=$OUT; export OUT=/tmp/r36c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  PRESET=tiny source scripts/gpu_env.sh
  echo "== sweep $(date +%T)"
  timeout 200 python scripts/kernel_sweep.py --cold --configs deep --rows 1 64 --shapes qkv o_proj gate_up down lm_head --json $OUT/sweep_deep.json
  echo "exit $? $(date +%T)"
  echo "== probe $(date +%T)"
  timeout 230 python scripts/cp_probe.py --rows 0 1 64 --variants 1024:8:32:16:1:0 512:4:32:16:1:0 256:4:16:16:2:0 256:4:32:16:1:2 --json $OUT/cp_probe.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -60 | cut -c1-230
tar czf $O/r36c.tar.gz -C /tmp r36c
