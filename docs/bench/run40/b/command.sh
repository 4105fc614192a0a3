#!/usr/bin/env bash
# run 40b: (1) the codec's graph beside the 64-row frame step on a second CUDA stream
# (scripts/overlap_probe.py); (2) the residual-unit kernel against the compiled torch unit
# (scripts/codec_kernel_probe.py); (3) the captured prefill per (prompts, length) with finer
# prompt buckets, on the torch blocks and on the Triton kernels (--prefill-kernel-rows 4096).
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== overlap $(date +%T)"
  timeout 200 python scripts/overlap_probe.py --preset 1.7b-customvoice --rows 64 --codec 16:16 32:16 8:16 32:2 --json $OUT/overlap.json
  echo "exit $? $(date +%T)"
  echo "== kernel probe $(date +%T)"
  timeout 150 python scripts/codec_kernel_probe.py --json $OUT/kernel_probe.json
  echo "exit $? $(date +%T)"
  P="--checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --kernels triton --batch-buckets 1 2 4 8 16 64 --profile-prefill 16 32 64 --profile-iters 40"
  echo "== prefill torch $(date +%T)"
  timeout 70 python benchmark/benchmark_model.py $P --json $OUT/prefill_torch.json
  echo "exit $? $(date +%T)"
  echo "== prefill kernels $(date +%T)"
  timeout 70 python benchmark/benchmark_model.py $P --prefill-kernel-rows 4096 --json $OUT/prefill_kernels.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -120 | cut -c1-260

