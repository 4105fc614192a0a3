"""What the persistent code-predictor kernel's time is made of, on a GPU (no checkpoint: random
weights of the 1.7B code predictor's shapes).

Times one frame's 15 residual steps of ``kernels.cp_step`` in a CUDA graph (median of replays,
CUDA events) for each row count and each variant: one synchronised launch per step with the
default tiles, one launch per phase (``--per-phase``), and the tile variants of ``--variants``
(not at 0 rows); with no rows at all (``--rows 0``: every phase empty) what is left is the
barriers (or the launches).

    python scripts/cp_probe.py --rows 0 1 64 --per-phase --variants 1024:8:32:16:1:1 512:4:16:16:2:1 --json out.json

A variant is ``BK:warps:BN:BN_narrow:grid_multiple:ahead`` (the K tile, warps per program, the
output tiles of the wide and the narrow GEMMs, programs per multiprocessor, phases of L2
prefetch ahead); the row tile and pipeline stages are ``kernels.cp_tiles``'.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from triton_qwen3_tts.engines.native import kernels as nk


def problem(dev, dt, S: int):
    """The 1.7B code predictor's weights (random), buffers and caches for ``S`` rows."""
    L, D, H, KVH, HD, I, V, TD, P = 5, 1024, 16, 8, 128, 3072, 2048, 2048, 16
    r = lambda *s: (torch.randn(*s, device=dev) * 0.02).to(dt)  # noqa: E731
    w = {
        "wqkv": r(L, (H + 2 * KVH) * HD, D),
        "wo": r(L, D, H * HD),
        "wgu": r(L, 2 * I, D),
        "wd": r(L, D, I),
        "qkw": torch.ones(L, H + KVH, HD, device=dev, dtype=dt),
        "pw": r(D, TD),
        "pb": r(D),
    }
    heads = [r(V, D) for _ in range(15)]
    tables = [r(V, TD) for _ in range(15)]
    bufs = {
        k: torch.zeros(2 * S, n, device=dev, dtype=dt)
        for k, n in (("xa", D), ("qkv", (H + 2 * KVH) * HD), ("att", H * HD), ("xb", D), ("act", I))
    }
    bufs["xa"].normal_()
    kc = torch.zeros(L, S, KVH, P, HD, device=dev, dtype=dt)
    cos, sin = torch.ones(P, HD, device=dev, dtype=dt), torch.zeros(P, HD, device=dev, dtype=dt)
    return dict(
        w=w, heads=heads, tables=tables, bufs=bufs, kc=kc, vc=torch.zeros_like(kc), cos=cos, sin=sin, H=H, KVH=KVH
    )


def frame(pb, B: int, synced: bool, sync, fault, logits, codes, **kw) -> None:
    sync.zero_()
    for j in range(1, 16):
        T, p0 = (2, 0) if j == 1 else (1, j)
        nk.cp_step(
            pb["bufs"], pb["w"], pb["heads"][j - 1], logits, pb["cos"], pb["sin"], pb["kc"], pb["vc"],
            sync[j - 1 : j], fault, B, T, p0, 1e-6, pb["H"], pb["KVH"],
            codes=codes[:B] if j > 1 else None, table=pb["tables"][j - 2] if j > 1 else None, synced=synced, **kw,
        )  # fmt: skip


def timed(fn, iters: int) -> float:
    """Median ms of ``iters`` replays of ``fn`` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 1, 64])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--variants", nargs="*", default=[], help="BK:warps:BN:BN_narrow:grid_multiple:ahead")
    ap.add_argument("--per-phase", action="store_true", help="also time one launch per phase (no barriers)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev, dt = torch.device("cuda"), torch.bfloat16
    S = max(max(args.rows), 1)
    pb = problem(dev, dt, S)
    sync = torch.zeros(15, device=dev, dtype=torch.int32)
    fault = torch.zeros(1, device=dev, dtype=torch.int32)
    logits = torch.zeros(S, 2048, device=dev, dtype=torch.float32)
    codes = torch.randint(0, 2048, (S,), device=dev)
    rows = []
    sms = nk.cp_grid(dev)

    def one(B, label, synced=True, **kw):
        try:
            ms = timed(lambda: frame(pb, B, synced, sync, fault, logits, codes, **kw), args.iters)
            row = {"rows": B, "variant": label, "frame_ms": round(ms, 4), "fault": int(fault.item())}
        except Exception as e:  # noqa: BLE001 - a variant the compiler refuses (shared memory): recorded
            row = {"rows": B, "variant": label, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)

    for B in args.rows:
        one(B, "default")
        if args.per_phase:
            one(B, "one launch per phase", synced=False)
        for v in args.variants if B else ():
            bk, warps, bn, bnn, mult, ahead = (int(x) for x in v.split(":"))
            BM, _, _, _, stages = nk.cp_tiles(max(1, 2 * B), 2, None)
            need = stages * (BM * bk + 2 * bk * bn) * 2
            st = stages if need <= 200_000 else 2
            one(B, v, config=(BM, bn, bnn, bk, st, warps), grid=mult * sms, ahead=ahead)
    res = {"triton": __import__("triton").__version__, "gpu": torch.cuda.get_device_name(), "grid": sms, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
