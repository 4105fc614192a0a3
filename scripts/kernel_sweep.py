"""Tile sweep of the native engine's fused linear kernel (engines/native/kernels.py) on a GPU.

For each GEMM of a 1.7B code-predictor layer (q/k/v with the norm, o-proj + residual, gate/up
with the norm and SwiGLU, down + residual, lm_head) and of a talker layer (``tk_*``), and each
row count, times the kernel under several tile configurations against the torch ops it replaces
(CUDA-graph replays, median of many), and prints the fastest configuration next to :func:`tiles`' choice. Tuning aid: the
kernels' tile choice lives in ``kernels.tiles``.

    python scripts/kernel_sweep.py --rows 1 64 --json sweep.json
    python scripts/kernel_sweep.py --rows 1 64 --cold --json sweep_cold.json   # weights from DRAM
    python scripts/kernel_sweep.py --rows 8 64 --cold --configs none --splits 1 2 4 8   # split-K
    python scripts/kernel_sweep.py --attention --rows 1 8 32 64 128 --json attn.json  # decode attention

``--attention`` sweeps the talker's decode attention instead (``kernels.decode_attention``, the
1.7B talker's 16 query and 8 kv heads of 128): positions per block, warps, pipeline stages and
context splits, at each row count and context (``--contexts``, every row at that position of
its power-of-two bucket), each call reading another copy of the KV cache (cold, as in the step,
where 28 layers' caches and weights pass through L2); the choice lives in
``kernels.decode_config``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch
import torch.nn.functional as F

from triton_qwen3_tts.engines.native import kernels as nk

SHAPES = {  # name: (N, K, kind)
    "qkv": (4096, 1024, "rms"),
    "o_proj": (1024, 2048, "res"),
    "gate_up": (3072, 1024, "swiglu"),
    "down": (1024, 3072, "res"),
    "lm_head": (2048, 1024, "head"),
    # the talker's (1.7B: hidden 2048, 16/8 heads of 128, MLP 6144, 3072 codec-head rows)
    "tk_qkv": (4096, 2048, "rms"),
    "tk_o_proj": (2048, 2048, "res"),
    "tk_gate_up": (6144, 2048, "swiglu"),
    "tk_down": (2048, 6144, "res"),
    "tk_head": (3072, 2048, "head"),
}


def _time(fn, iters: int, calls: int = 10) -> float:
    """Median ms of a CUDA graph of ``calls`` calls ``fn(i)``, replayed ``iters`` times (per call)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / calls)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument(
        "--cold",
        action="store_true",
        help="each call reads another copy of the weights (copies of at least 4x the L2 cache in all), as in "
        "the decode step, where a layer's weights are not in L2 when its GEMM runs; default: one copy, "
        "10 calls (its weights stay in L2 after the first)",
    )
    ap.add_argument(
        "--configs",
        choices=("short", "wide", "deep", "split", "none"),
        default="short",
        help="short: N tiles 16/32/64 x K tiles 128/256 x (4 warps, 3 or 4 stages); wide: also 8 warps and 2 "
        "or 5 stages; deep: N tiles 16/32 x K tiles 512/1024 x (4 or 8 warps, 2 stages), fewer K steps per "
        "program (the K loop is not software-pipelined: one memory latency per K tile); split: N tiles 32/64 x K "
        "tiles 128 x (4 warps and 3 or 4 stages, 8 warps and 4), wider output tiles for --splits to refill; none: "
        "tiles()' alone",
    )
    ap.add_argument(
        "--gemv",
        action="store_true",
        help="also time the few-row kernel (kernels.GEMV_ROWS) at row counts up to 8",
    )
    ap.add_argument(
        "--splits",
        type=int,
        nargs="+",
        default=[1],
        help="K parts (split-K) of every candidate tile configuration; the default configuration is also "
        "timed with kernels.k_splits' choice",
    )
    ap.add_argument(
        "--attention",
        action="store_true",
        help="sweep the talker's decode attention (kernels.decode_attention) instead of the GEMMs",
    )
    ap.add_argument(
        "--contexts",
        type=int,
        nargs="+",
        default=[100, 300, 700],
        help="with --attention: each row's last position (its context bucket: the next power of two above it)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.attention:
        return sweep_attention(args)
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    results = []
    for name, M in itertools.product(args.shapes, args.rows):
        N, K, kind = SHAPES[name]
        Nw = 2 * N if kind == "swiglu" else N
        if args.cold:
            l2 = torch.cuda.get_device_properties(0).L2_cache_size
            copies = max(10, -(-4 * l2 // (Nw * K * 2)))
        else:
            copies = 1
        ws = [torch.randn(Nw, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        calls = max(10, copies)
        x = torch.randn(M, K, device=dev, dtype=dt)
        ln = torch.ones(K, device=dev, dtype=dt)
        res = torch.randn(M, N, device=dev, dtype=dt)
        kw = {
            "rms": dict(rms=True),
            "res": dict(residual=res),
            "swiglu": dict(rms=True, swiglu=True),
            "head": dict(rms=True, out_dtype=torch.float32),
        }[kind]

        def torch_ref(i):
            h = F.rms_norm(x, (K,), ln, 1e-6) if kind in ("rms", "swiglu", "head") else x
            y = F.linear(h, ws[i % copies])
            if kind == "swiglu":
                gg, u = y.split(N, dim=-1)
                return F.silu(gg) * u
            if kind == "res":
                return res + y
            return y.float() if kind == "head" else y

        row = {"gemm": name, "M": M, "N": N, "K": K, "cold": args.cold, "torch_ms": _time(torch_ref, args.iters, calls)}
        default = nk.launch_config(M, N, K, x.device, swiglu=kind == "swiglu")  # what linear() launches
        best = None
        if args.configs == "none":
            cands = [default[1:5]]  # tiles()' alone, under each of --splits
        elif args.configs == "split":
            cands = [(bn, 128, w_, st) for bn in (32, 64) for w_, st in ((4, 3), (4, 4), (8, 4))]
        elif args.configs == "deep":
            cands = [(bn, bk, w_, 2) for bn in (16, 32) for bk in (512, 1024) for w_ in (4, 8)]
        else:
            ws_st = ((4, 3), (4, 4)) if args.configs == "short" else ((4, 2), (4, 3), (4, 4), (4, 5), (8, 3), (8, 4))
            cands = [(bn, bk, w_, st) for bn in (16, 32, 64) for bk in (128, 256) for w_, st in ws_st]
        cands = [(*c, sp) for c in cands for sp in args.splits]
        if default[1:] not in cands:
            cands.append(default[1:])
        for BN, BK, warps, stages, split in cands:
            cfg = (default[0], BN, BK, warps, stages, split)  # tiles()' row tile for M
            try:
                ms = _time(lambda i: nk.linear(x, ws[i % copies], config=cfg, **kw), args.iters, calls)
            except Exception as e:  # noqa: BLE001 - a config the compiler refuses (shared memory)
                ms = float("inf")
                print(f"  {name} M={M} {cfg}: {type(e).__name__}")
            if cfg == default:
                row["default_ms"] = ms
            row.setdefault("timed", []).append([list(cfg), ms])
            if args.configs == "none":
                print(f"  {name} M={M} {cfg}: {ms * 1e3:7.1f} us")
            if best is None or ms < best[0]:
                best = (ms, cfg)
        row["default"] = default
        if args.gemv and M <= 8:
            default_rows = nk.GEMV_ROWS
            nk.GEMV_ROWS = M
            row["gemv_ms"] = _time(lambda i: nk.linear(x, ws[i % copies], **kw), args.iters, calls)
            nk.GEMV_ROWS = default_rows
            print(
                f"  {name} M={M}: few-row kernel {row['gemv_ms'] * 1e3:7.1f} us {nk.gemv_tiles(N, K, kind == 'swiglu')}"
            )
        row["best_ms"], row["best"] = best
        ideal = (Nw * K * 2) / 3.35e12 * 1e3
        print(
            f"{name:8s} M={M:4d}  torch {row['torch_ms'] * 1e3:7.1f} us  tiles() {row.get('default_ms', float('nan')) * 1e3:7.1f} us "
            f"{default}  best {best[0] * 1e3:7.1f} us {best[1]}  (weights at 3.35 TB/s: {ideal * 1e3:5.1f} us)",
            flush=True,
        )
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


ATTN_HEADS, ATTN_KV_HEADS, ATTN_HD = 16, 8, 128  # the 1.7B talker's


def attention_candidates(C: int) -> list:
    """(positions per block, num_warps, num_stages, splits) configurations of
    :func:`kernels.decode_attention` for a context bucket ``C``: blocks of 32-128 positions, 4 or
    8 warps, 2 or 3 stages (and one unpipelined), 1-16 splits of at least one block each."""
    out = []
    for block, warps, stages in [(b, w, st) for b in (32, 64, 128) for w in (4, 8) for st in (2, 3)] + [(64, 4, 1)]:
        for splits in (1, 2, 4, 8, 16):
            if block <= C and C // splits >= block:
                out.append((block, warps, stages, splits))
    return out


def sweep_attention(args) -> int:
    """Time :func:`kernels.decode_attention` under :func:`attention_candidates` at each row count
    and context; print the default's time and the fastest three."""
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    H, KV, hd = ATTN_HEADS, ATTN_KV_HEADS, ATTN_HD
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for ctx, B in itertools.product(args.contexts, args.rows):
        C = 1 << ctx.bit_length()  # the bucket above the last position
        per = 2 * B * KV * C * hd * 2  # one copy's K and V bytes
        copies = min(64, max(4, -(-4 * l2 // per)))
        kcs = [torch.randn(B, KV, C, hd, device=dev, dtype=dt) for _ in range(copies)]
        vcs = [torch.randn(B, KV, C, hd, device=dev, dtype=dt) for _ in range(copies)]
        q = torch.randn(B, H * hd, device=dev, dtype=dt)
        pos = torch.full((B,), ctx, device=dev, dtype=torch.int64)
        default = nk.decode_config(B, KV, C, sms)
        row = {"B": B, "ctx": ctx, "C": C, "default": list(default), "timed": []}
        cands = attention_candidates(C)
        if default not in cands:
            cands.append(default)
        for cfg in cands:
            try:
                ms = _time(
                    lambda i: nk.decode_attention(q, kcs[i % copies], vcs[i % copies], pos, C, H, KV, config=cfg),
                    args.iters,
                    max(10, copies),
                )
            except Exception as e:  # noqa: BLE001 - a config the compiler refuses (shared memory)
                ms = float("inf")
                print(f"  B={B} ctx={ctx} {cfg}: {type(e).__name__}")
            row["timed"].append([list(cfg), ms])
            if cfg == default:
                row["default_ms"] = ms
        ranked = sorted(row["timed"], key=lambda t: t[1])
        row["best"], row["best_ms"] = ranked[0]
        ideal = per * (ctx + 1) / C / 4.8e12 * 1e3  # the cached positions' bytes at 4.8 TB/s
        top = "  ".join(f"{tuple(c)} {ms * 1e3:6.1f}" for c, ms in ranked[:3])
        print(
            f"attn B={B:4d} ctx={ctx:5d} C={C:5d}  default {tuple(default)} {row['default_ms'] * 1e3:6.1f} us  "
            f"best {top}  (KV at 4.8 TB/s: {ideal * 1e3:5.1f} us)",
            flush=True,
        )
        results.append(row)
        if args.json:  # after each: a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
