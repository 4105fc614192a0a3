#!/usr/bin/env bash
# run 41e: main with the code predictor's attention on 2 warps from 64 rows (41d), the frame step at 1-128 rows.
O=$OUT; export OUT=/tmp/r41e; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  P="--checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 8 32 64 128 --max-num-seqs 128"
  echo "== main $(date +%T)"
  timeout 110 python benchmark/benchmark_model.py $P --json $OUT/profile_main.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
cp out/devcmd/cp_warps.py $OUT/
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *$" | grep -v "^per-frame step" | tail -40 | cut -c1-200
tar czf $O/r41e.tar.gz -C /tmp r41e
