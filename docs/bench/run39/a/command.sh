#!/usr/bin/env bash
# run 39a: where the stateful codec's 32 x 25 call spends its time (eager leaf modules, kernel
# tables eager and compiled-in-graph, cuBLAS GEMMs of each conv's FLOPs), and the frame step on
# main (1fbb1f8's wide tiles) at 1/8/32/64 rows.
O=$OUT; export OUT=/tmp/r39a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== codec $(date +%T)"
  timeout 200 python scripts/codec_profile.py --compile --json $OUT/codec_profile.json
  echo "exit $? $(date +%T)"
  echo "== step $(date +%T)"
  timeout 120 python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 8 32 64 --json $OUT/profile_step.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -150 | cut -c1-200
tar czf $O/r39a.tar.gz -C /tmp r39a
