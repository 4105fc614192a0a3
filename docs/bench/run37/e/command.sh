#!/usr/bin/env bash
# run 37e (the machine of 37c-d, still warm): the code parity at one row per call (the few-row
# GEMM kernel, PDL "few", the sampling kernel of 2a1fef3), 200 frames; the step at 1 and 64 rows
# on the way (20 replays each)
mkdir -p $OUT/r37e
source scripts/gpu_env.sh >/dev/null 2>&1; timeout 190 python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --batch-buckets 1 --profile-iters 20 --cp-parity 200 --cp-parity-rows 1 --json $OUT/r37e/profile_parity1.json 2>&1 | grep -v "Warning\|warn" | tail -8 | tee $OUT/r37e/console.txt
