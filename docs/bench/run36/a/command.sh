#!/usr/bin/env bash
# run 36a: the persistent code-predictor kernel (native_cp_kernel persistent) on the H200: its
# load-time self-test (one synchronised launch against one launch per phase), the frame step at
# 1/8/32/64 rows with it (compiled, Triton kernels, context 300, code parity over 256 frames),
# the five-kernels-per-layer path on the same machine, the kernel without its L2 prefetch, and
# the engine's greedy frames with it (graphs == eager).
O=$OUT; export OUT=/tmp/r36a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
P="--checkpoint /tmp/ckpt-1.7b-customvoice --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton"
{
  source scripts/gpu_env.sh
  python -c "import triton; print('triton', triton.__version__)"
  echo "== self-test $(date +%T)"
  timeout 60 python -c "
import torch, time
from triton_qwen3_tts.engines.native import kernels as nk
t = time.time(); print('cp_self_test:', nk.cp_self_test(torch.device('cuda'), torch.bfloat16), round(time.time() - t, 1), 's')"
  echo "exit $? $(date +%T)"
  echo "== profile persistent $(date +%T)"
  timeout 170 python benchmark/benchmark_model.py $P --batch-buckets 1 8 32 64 --cp-kernel persistent --cp-parity 256 --json $OUT/profile_persistent.json
  echo "exit $? $(date +%T)"
  echo "== profile layers $(date +%T)"
  timeout 90 python benchmark/benchmark_model.py $P --batch-buckets 1 64 --json $OUT/profile_layers.json
  echo "exit $? $(date +%T)"
  echo "== profile persistent, no prefetch $(date +%T)"
  timeout 90 python benchmark/benchmark_model.py $P --batch-buckets 1 64 --cp-kernel persistent --cp-ahead 0 --json $OUT/profile_persistent_ahead0.json
  echo "exit $? $(date +%T)"
  echo "== check $(date +%T)"
  timeout 120 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 --check --kernels triton --cp-kernel persistent --json $OUT/check.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | tail -70 | cut -c1-220
tar czf $O/r36a.tar.gz -C /tmp r36a
