#!/usr/bin/env bash
# run 37a: the sampling kernel (kernels.sample: one kernel per draw instead of torch.topk and
# four to five kernels around it) on by default: the frame step at 1/2/4/8/64 rows with a
# kernel table at 1 and 64 rows and the code parity at one row over 2,000 frames; the same step
# with the sampling kernel off (A/B on one machine); with programmatic dependent launch on (the
# few-row kernel now loads its weights before it waits) and the parity at 64 rows; the engine's
# greedy frames (graphs == eager).
O=$OUT; export OUT=/tmp/r37a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
T0=$(date +%s)
{
  source scripts/gpu_env.sh
  P="python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 2 4 8 64"
  echo "== on $(date +%T)"
  timeout 200 $P --profile-kernels 1 64 --cp-parity 2000 --cp-parity-rows 1 --json $OUT/profile_on.json
  echo "exit $? $(date +%T)"
  echo "== off $(date +%T)"
  timeout 100 $P --sample-kernel off --json $OUT/profile_off.json
  echo "exit $? $(date +%T)"
  echo "== pdl $(date +%T)"
  timeout 110 $P --pdl on --profile-kernels 1 64 --cp-parity 2000 --json $OUT/profile_pdl.json
  echo "exit $? $(date +%T)"
  left=$(( 560 - ($(date +%s) - T0) ))
  echo "== check $(date +%T) left ${left}s"
  timeout $left python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]*  [a-z_]*[(<]" | tail -60 | cut -c1-200
tar czf $O/r37a.tar.gz -C /tmp r37a
