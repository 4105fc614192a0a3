#!/usr/bin/env bash
# run 41a: the talker's decode attention (23 us a layer at 64 rows of 300 positions in 38h, about
# ten times its KV bytes' time) swept over positions per block, warps, stages and splits (cold KV
# caches) at 1-128 rows and contexts 100/300/700; then the frame step at 1/8/32/64/128 rows with
# main's decode_config and with the sweep's fastest configuration for each (rows, bucket).
O=$OUT; export OUT=/tmp/r41a; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
cat > /tmp/sweep_attn.py <<'PY'
"""benchmark_model.py with the decode attention on a sweep's fastest configurations: attn.json, then its args."""
import json
import sys

from triton_qwen3_tts.engines.native import kernels as nk

best = {(r["B"], r["C"]): tuple(r["best"]) for r in json.load(open(sys.argv[1]))}
print("decode attention configurations:", best, flush=True)
orig = nk.decode_config
nk.decode_config = lambda B, kv, C, sms: best.get((B, C)) or orig(B, kv, C, sms)
from triton_qwen3_tts.tools.bench_model import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
PY
{
  source scripts/gpu_env.sh
  echo "== sweep $(date +%T)"
  timeout 240 python scripts/kernel_sweep.py --attention --rows 1 8 32 64 128 --contexts 300 100 700 --iters 30 --json $OUT/attn.json
  echo "exit $? $(date +%T)"
  P="--checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 8 32 64 128"
  echo "== default $(date +%T)"
  timeout 100 python benchmark/benchmark_model.py $P --json $OUT/profile_default.json
  echo "exit $? $(date +%T)"
  echo "== sweep attention $(date +%T)"
  PYTHONPATH=. timeout 100 python /tmp/sweep_attn.py $OUT/attn.json $P --json $OUT/profile_sweep_attn.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
cp /tmp/sweep_attn.py $OUT/
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *$" | tail -45 | cut -c1-330
tar czf $O/r41a.tar.gz -C /tmp r41a
