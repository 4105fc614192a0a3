#!/usr/bin/env bash
# run 38i: with split-K, wider output tiles become possible for the 64-row GEMMs (fewer re-reads
# of the input from L2, the programs refilled by K parts): every decode GEMM at 64 rows under
# N tiles 32/64 x K tiles 128 x (4 warps, 3 or 4 stages; 8 warps, 4) x 1/2/4 K parts (cold
# weights); then the 64-row frame step with main's tiles and with the sweep's fastest
# configuration of each GEMM (linear() given it for the 64-row calls), one machine.
O=$OUT; export OUT=/tmp/r38i; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
cat > /tmp/sweep_tiles.py <<'PY'
"""benchmark_model.py with the 64-row GEMMs on a sweep's fastest configurations: sweep.json, then its args."""
import json
import sys

from triton_qwen3_tts.engines.native import kernels as nk

best = {(r["N"], r["K"], r["gemm"].endswith("gate_up")): tuple(r["best"]) for r in json.load(open(sys.argv[1])) if r["M"] == 64}
print("64-row configurations:", best, flush=True)
orig = nk.linear


def linear(x, w, *, config=None, swiglu=False, rows=None, **kw):
    M = rows.shape[0] if rows is not None else x.shape[0]
    key = (w.shape[0] // 2 if swiglu else w.shape[0], w.shape[1], swiglu)
    if config is None and M == 64 and key in best:
        config = best[key]
    return orig(x, w, config=config, swiglu=swiglu, rows=rows, **kw)


nk.linear = linear
from triton_qwen3_tts.tools.bench_model import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
PY
{
  source scripts/gpu_env.sh
  echo "== sweep $(date +%T)"
  timeout 100 python scripts/kernel_sweep.py --cold --configs split --rows 64 --splits 1 2 4 --json $OUT/sweep_tiles.json
  echo "exit $? $(date +%T)"
  P="--checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 64"
  echo "== default $(date +%T)"
  timeout 70 python benchmark/benchmark_model.py $P --json $OUT/profile_default.json
  echo "exit $? $(date +%T)"
  echo "== sweep tiles $(date +%T)"
  PYTHONPATH=. timeout 70 python /tmp/sweep_tiles.py $OUT/sweep_tiles.json $P --json $OUT/profile_sweep_tiles.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
cp /tmp/sweep_tiles.py $OUT/
grep -v "UserWarning\|_warn_once\|^W1\|warn_once\|^  [a-z_]* M=" $OUT/console.txt | tail -40 | cut -c1-250
tar czf $O/r38i.tar.gz -C /tmp r38i
