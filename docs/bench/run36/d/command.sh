#!/usr/bin/env bash
# run 36d: the few-row GEMM kernel (GEMV_ROWS: whole weight rows per program, no K loop) against
# the tiled one: every 1.7B decode GEMM at 1 and 8 rows (cold weights), then the frame step at
# 1 and 8 rows with it and without, one machine.
O=$OUT; export OUT=/tmp/r36d; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
P="--checkpoint /tmp/ckpt-1.7b-customvoice --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 8"
{
  source scripts/gpu_env.sh
  echo "== sweep $(date +%T)"
  timeout 100 python scripts/kernel_sweep.py --cold --configs none --gemv --rows 1 8 --json $OUT/sweep_gemv.json
  echo "exit $? $(date +%T)"
  echo "== profile gemv 8 $(date +%T)"
  timeout 100 python benchmark/benchmark_model.py $P --gemv-rows 8 --cp-parity 128 --json $OUT/profile_gemv8.json
  echo "exit $? $(date +%T)"
  echo "== profile tiled $(date +%T)"
  timeout 80 python benchmark/benchmark_model.py $P --json $OUT/profile_tiled.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -50 | cut -c1-200
tar czf $O/r36d.tar.gz -C /tmp r36d
