#!/usr/bin/env bash
# run 35e: the GPU-time goals' baselines on the H200 (main 961c18d, the device tool's one-GPU kind
# now): the frame step at 1/8/32/64 rows (compiled, Triton kernels, context 300) and every slot of
# the compiled stateful codec (32 streams x 25 new frames is codec_stateful_b32_audio_s_per_s).
O=$OUT; export OUT=/tmp/r35e; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== profile $(date +%T)"
  timeout 100 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 \
    --profile-step --profile-ctx 300 --batch-buckets 1 8 32 64 --compile --kernels triton --decode-attention triton \
    --json $OUT/profile_step.json
  echo "exit $? $(date +%T)"
  echo "== codec $(date +%T)"
  timeout 110 python scripts/codec_slots.py --checkpoint "$CKPT" --compile --chunk-frames 25 --json $OUT/codec_slots.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1" $OUT/console.txt | tail -60 | cut -c1-190
tar czf $O/r35e.tar.gz -C /tmp r35e
