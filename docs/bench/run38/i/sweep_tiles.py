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
