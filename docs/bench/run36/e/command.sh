#!/usr/bin/env bash
# run 36e: the default configuration with the few-row kernel on (GEMV_ROWS 2): the frame step at
# 1/2/4/8/64 rows and the code parity, then the engine's greedy frames (graphs == eager).
O=$OUT; export OUT=/tmp/r36e; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== profile $(date +%T)"
  timeout 110 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 2 4 8 64 --cp-parity 128 --json $OUT/profile_step.json
  echo "exit $? $(date +%T)"
  echo "== check $(date +%T)"
  timeout 80 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -30 | cut -c1-200
tar czf $O/r36e.tar.gz -C /tmp r36e
