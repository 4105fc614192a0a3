#!/usr/bin/env bash
# run 44d: an admission's host time behind a decode step of 56 running rows on the GPU
# (scripts/admission_profile.py: the engine's own _admit_many driven by hand, uncompiled, CUDA
# graphs), 1, 4 and 8 prompts of 48 rows with 24 trailing rows each, 30 admissions a case; the
# prompts as the engine gets them or pinned in bf16, with or without a busy Python thread beside.
set -u
source scripts/gpu_env.sh > "$OUT/env.txt" 2>&1 || { tail -20 "$OUT/env.txt"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
timeout 260 python scripts/admission_profile.py --checkpoint "$CKPT" --json "$OUT/admission.json" 2>&1 \
  | tee "$OUT/admission.txt"
