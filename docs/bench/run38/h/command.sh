#!/usr/bin/env bash
# run 38h: the code predictor's attention with every load before its first store (aff58c0),
# split-K default (1): the frame step at 1/2/4/8/64 rows with kernel tables at 1 and 64 rows and
# the code parity at 64 rows over 2,000 frames; the step again without the tables; the engine's
# greedy frames (graphs == eager).
O=$OUT; export OUT=/tmp/r38h; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
T0=$(date +%s)
{
  source scripts/gpu_env.sh
  P="python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 2 4 8 64"
  echo "== default $(date +%T)"
  timeout 140 $P --profile-kernels 1 64 --cp-parity 2000 --json $OUT/profile_default.json
  echo "exit $? $(date +%T)"
  echo "== again $(date +%T)"
  timeout 90 $P --json $OUT/profile_again.json
  echo "exit $? $(date +%T)"
  left=$(( 420 - ($(date +%s) - T0) ))
  echo "== check $(date +%T) left ${left}s"
  timeout $left python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]*  void\|^ *[0-9.]* *[0-9.]* *[0-9.]*  triton_\|Memcpy\|memcpy\|nvjet" | tail -60 | cut -c1-200
tar czf $O/r38h.tar.gz -C /tmp r38h
