#!/usr/bin/env bash
# run 38d: split-K at most one program per multiprocessor (native_split_k 1, the default after
# run 38a) and the code predictor's attention without the read-back of its own stores: the frame
# step at 1/2/4/8/64 rows with kernel tables at 1 and 64 rows and the code parity at 64 rows
# over 2,000 frames; the same with split-K off (A/B on one machine); the engine's greedy frames.
O=$OUT; export OUT=/tmp/r38d; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
T0=$(date +%s)
{
  source scripts/gpu_env.sh
  P="python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 2 4 8 64"
  echo "== split1 $(date +%T)"
  timeout 140 $P --profile-kernels 1 64 --cp-parity 2000 --json $OUT/profile_split1.json
  echo "exit $? $(date +%T)"
  echo "== split0 $(date +%T)"
  timeout 100 $P --split-k 0 --json $OUT/profile_split0.json
  echo "exit $? $(date +%T)"
  echo "== check $(date +%T)"
  timeout 120 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json
  echo "exit $? $(date +%T)"
  left=$(( 540 - ($(date +%s) - T0) ))
  echo "== split1 again $(date +%T) left ${left}s"
  [ $left -gt 50 ] && timeout $left $P --json $OUT/profile_split1_again.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]*  [a-z_]*[(<]\|^  [a-z_]* M=" | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]*  void\|^ *[0-9.]* *[0-9.]* *[0-9.]*  triton_\|Memcpy\|memcpy\|nvjet" | tail -70 | cut -c1-200
tar czf $O/r38d.tar.gz -C /tmp r38d
