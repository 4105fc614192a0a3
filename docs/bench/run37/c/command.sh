#!/usr/bin/env bash
# run 37c: the defaults after run 37a: programmatic dependent launch on for launches of at most
# GEMV_ROWS rows (PDL "few") and the sampling kernel with its candidates found by a threshold
# (the K-th largest of 256 group maxima) and compacted, instead of a bitonic top-k over the row:
# the frame step at 1/2/4/8/64 rows with kernel tables at 1 and 64 rows and the code parity at
# one row (600 frames); the same with the sampling kernel off (A/B); the engine's greedy frames.
O=$OUT; export OUT=/tmp/r37c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
T0=$(date +%s)
{
  source scripts/gpu_env.sh
  P="python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 2 4 8 64"
  echo "== default $(date +%T)"
  timeout 180 $P --profile-kernels 1 64 --cp-parity 600 --cp-parity-rows 1 --json $OUT/profile_default.json
  echo "exit $? $(date +%T)"
  echo "== sample-off $(date +%T)"
  timeout 100 $P --sample-kernel off --json $OUT/profile_sample_off.json
  echo "exit $? $(date +%T)"
  left=$(( 500 - ($(date +%s) - T0) ))
  echo "== check $(date +%T) left ${left}s"
  timeout $left python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]*  void\|^ *[0-9.]* *[0-9.]* *[0-9.]*  triton_\|Memcpy\|memcpy\|nvjet" | tail -60 | cut -c1-200
tar czf $O/r37c.tar.gz -C /tmp r37c
