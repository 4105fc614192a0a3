#!/usr/bin/env bash
# run 31c: the step with run 31b's tiles and the decode attention split at most 64 positions per
# program, against SDPA (same machine)
O=$OUT; export OUT=/tmp/r31c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  for da in triton sdpa; do
    echo "== profile $da $(date +%T)"
    K=""; [ $da = triton ] && K="--profile-kernels 1 64"
    timeout 200 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 \
      --profile-step --profile-ctx 300 --batch-buckets 1 8 32 64 --compile --kernels triton --decode-attention $da \
      $K --json $OUT/profile_step_$da.json
    echo "exit $? $(date +%T)"
  done
} > $OUT/console.txt 2>&1
grep -v "^  *[0-9.]* *[0-9.]* *[0-9.]*  void\|UserWarning\|_warn_once" $OUT/console.txt | tail -75 | cut -c1-190
tar czf $O/r31c.tar.gz -C /tmp r31c
