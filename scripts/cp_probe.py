"""What the persistent code-predictor kernel's time is made of, on a GPU (no checkpoint: random
weights of the 1.7B code predictor's shapes).

Times one frame's 15 residual steps of ``kernels.cp_step`` in a CUDA graph (median of replays,
CUDA events) for each row count: as one synchronised launch per step, as one launch per phase,
and with no rows at all (``B = 0``: every phase empty, so what is left is the barriers, or the
launches); each with and without ``kernels.K_PREFETCH``. Also reports whether this Triton
software-pipelines the GEMM tiles' K loop (asynchronous copies in the compiled ``linear``).

    python scripts/cp_probe.py --rows 0 1 64 --json out.json
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


def frame(pb, B: int, synced: bool, sync, fault, logits, codes) -> None:
    sync.zero_()
    for j in range(1, 16):
        T, p0 = (2, 0) if j == 1 else (1, j)
        nk.cp_step(
            pb["bufs"], pb["w"], pb["heads"][j - 1], logits, pb["cos"], pb["sin"], pb["kc"], pb["vc"],
            sync[j - 1 : j], fault, B, T, p0, 1e-6, pb["H"], pb["KVH"],
            codes=codes[:B] if j > 1 else None, table=pb["tables"][j - 2] if j > 1 else None, synced=synced,
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


def pipelined() -> dict:
    """Asynchronous copies in the compiled ``_linear_kernel`` variants (Triton's software
    pipelining of the K loop), per variant seen in this process."""
    out = {}
    try:
        for dev_cache in nk._linear_kernel.device_caches.values():
            for key, k in dev_cache[0].items():
                ir = k.asm.get("ttgir", "")
                out[str(key)[:80]] = {
                    "async_copies": ir.count("async_copy_global_to_local"),
                    "shared": k.metadata.shared,
                }
    except Exception as e:  # noqa: BLE001 - Triton's caches are internal: report what failed
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 1, 64])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev, dt = torch.device("cuda"), torch.bfloat16
    S = max(max(args.rows), 1)
    pb = problem(dev, dt, S)
    sync = torch.zeros(15, device=dev, dtype=torch.int32)
    fault = torch.zeros(1, device=dev, dtype=torch.int32)
    logits = torch.zeros(S, 2048, device=dev, dtype=torch.float32)
    codes = torch.randint(0, 2048, (S,), device=dev)
    x = torch.randn(1, 1024, device=dev, dtype=dt)
    rows = []
    for kpf in (False, True):
        nk.K_PREFETCH = kpf
        nk.linear(x, pb["w"]["wqkv"][0])  # one compiled linear per K-loop form, for pipelined()
        for B in args.rows:
            for synced in (True, False):
                ms = timed(lambda: frame(pb, B, synced, sync, fault, logits, codes), args.iters)
                row = {
                    "rows": B,
                    "k_prefetch": kpf,
                    "launch": "one per step" if synced else "one per phase",
                    "frame_ms": round(ms, 4),
                    "fault": int(fault.item()),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    res = {
        "triton": __import__("triton").__version__,
        "gpu": torch.cuda.get_device_name(),
        "grid": nk.cp_grid(dev),
        "rows": rows,
        "linear_compiled": pipelined(),
    }
    print(json.dumps(res["linear_compiled"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
