#!/usr/bin/env bash
# run 31a: the frame step's kernels (torch.profiler) at batch 1 and 64, compiled, Triton kernels
O=$OUT; export OUT=/tmp/r31a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== profile $(date +%T)"
  timeout 420 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 \
    --profile-step --profile-ctx 300 --batch-buckets 1 8 32 64 --compile --kernels triton \
    --profile-kernels 1 64 --json $OUT/profile_step.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
tail -90 $OUT/console.txt | cut -c1-160
tar czf $O/r31a.tar.gz -C /tmp r31a
