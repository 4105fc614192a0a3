#!/usr/bin/env bash
# run 36b: the GEMM tiles' K loop with the next tile's loads issued before the current tile's
# dot (K_PREFETCH, --k-prefetch): the frame step at 1/8/32/64 rows on the five-kernels-per-layer
# path, at 1/64 rows with the persistent code-predictor kernel, then scripts/cp_probe.py (what
# the persistent kernel's frame is made of: its barriers alone, B = 0).
O=$OUT; export OUT=/tmp/r36b; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
P="--checkpoint /tmp/ckpt-1.7b-customvoice --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton"
{
  source scripts/gpu_env.sh
  echo "== profile layers, k-prefetch $(date +%T)"
  timeout 130 python benchmark/benchmark_model.py $P --batch-buckets 1 8 32 64 --k-prefetch --cp-parity 256 --json $OUT/profile_layers_kpf.json
  echo "exit $? $(date +%T)"
  echo "== profile persistent, k-prefetch $(date +%T)"
  timeout 100 python benchmark/benchmark_model.py $P --batch-buckets 1 64 --cp-kernel persistent --k-prefetch --json $OUT/profile_persistent_kpf.json
  echo "exit $? $(date +%T)"
  echo "== probe $(date +%T)"
  timeout 200 python scripts/cp_probe.py --rows 0 1 --json $OUT/cp_probe.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -60 | cut -c1-220
tar czf $O/r36b.tar.gz -C /tmp r36b
