#!/usr/bin/env bash
# run 38a: split-K in the tiled GEMM kernel (K cut into parts until a launch has about
# SPLIT_K_TARGET programs per multiprocessor; the tile's last program adds the parts): every
# 1.7B decode GEMM at 8 and 64 rows with 1/2/4/8 parts (cold weights); the frame step at
# 1/2/4/8/64 rows with split-K off (0), the default (2, with the kernel table at 64 rows and the
# code parity at 64 rows over 2,000 frames), 4 and 1; the engine's greedy frames (graphs == eager).
O=$OUT; export OUT=/tmp/r38a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
T0=$(date +%s)
{
  source scripts/gpu_env.sh
  echo "== sweep $(date +%T)"
  timeout 150 python scripts/kernel_sweep.py --cold --configs none --rows 8 64 --splits 1 2 4 8 --json $OUT/sweep_split.json
  echo "exit $? $(date +%T)"
  P="python benchmark/benchmark_model.py --checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 2 4 8 64"
  echo "== split0 $(date +%T)"
  timeout 100 $P --split-k 0 --json $OUT/profile_split0.json
  echo "exit $? $(date +%T)"
  echo "== split2 $(date +%T)"
  timeout 130 $P --profile-kernels 64 --cp-parity 2000 --json $OUT/profile_split2.json
  echo "exit $? $(date +%T)"
  echo "== split4 $(date +%T)"
  timeout 100 $P --split-k 4 --json $OUT/profile_split4.json
  echo "exit $? $(date +%T)"
  left=$(( 480 - ($(date +%s) - T0) ))
  echo "== check $(date +%T) left ${left}s"
  timeout $left python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --json $OUT/check.json
  echo "exit $? $(date +%T)"
  left=$(( 555 - ($(date +%s) - T0) ))
  echo "== split1 $(date +%T) left ${left}s"
  [ $left -gt 50 ] && timeout $left $P --split-k 1 --json $OUT/profile_split1.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]*  [a-z_]*[(<]\|^  [a-z_]* M=" | tail -70 | cut -c1-220
tar czf $O/r38a.tar.gz -C /tmp r38a
