"""Sampling's candidates by a full sort instead of torch.topk: micro timings, then (with args)
benchmark_model.py with native.model._sample_ids replaced by the sort variant."""
import statistics
import sys

import torch

from triton_qwen3_tts.engines.native import layers, model

_NEG_INF = float("-inf")


def sample_ids_sort(scores, greedy, temp, top_k, top_p, g, K: int, use_top_p: bool):
    arg = scores.argmax(dim=-1)
    vals, idx = torch.sort(scores / temp[:, None], dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :K], idx[:, :K]
    kth = vals.gather(1, (top_k - 1).clamp(0, K - 1)[:, None])
    keep = vals >= kth
    if use_top_p:
        probs = torch.softmax(vals.masked_fill(~keep, _NEG_INF), dim=-1)
        excl = probs.cumsum(dim=-1) - probs
        tp = top_p[:, None]
        keep = keep & ((excl < tp) | (tp >= 1.0))
        keep[:, 0] = True
    choice = (vals + g).masked_fill(~keep, _NEG_INF).argmax(dim=-1)
    return torch.where(greedy, arg, idx.gather(1, choice[:, None])[:, 0])


def _time(fn, iters=50, calls=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(calls):
            fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        gr.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / calls * 1e3)
    return statistics.median(ts)


def micro():
    dev = "cuda"
    K = 50
    for B, V in ((1, 2048), (8, 2048), (64, 2048), (128, 2048), (64, 3072)):
        x = torch.randn(B, V, device=dev) * 3
        greedy = torch.zeros(B, dtype=torch.bool, device=dev)
        temp = torch.full((B,), 0.9, device=dev)
        tk = torch.full((B,), K, device=dev, dtype=torch.int64)
        tp = torch.ones(B, device=dev)
        g = torch.rand(B, K, device=dev)
        row = {
            "topk": _time(lambda: torch.topk(x, K, dim=-1)),
            "sort": _time(lambda: torch.sort(x, dim=-1, descending=True)),
            "sort_stable": _time(lambda: torch.sort(x, dim=-1, descending=True, stable=True)),
        }
        for name, f in (("draw_topk", layers._sample_ids), ("draw_sort", sample_ids_sort)):
            cf = torch.compile(f, dynamic=False)
            row[name] = _time(lambda: f(x, greedy, temp, tk, tp, g, K, False))
            row[name + "_compiled"] = _time(lambda: cf(x, greedy, temp, tk, tp, g, K, False))
        same = bool((layers._sample_ids(x, greedy, temp, tk, tp, g, K, False) == sample_ids_sort(x, greedy, temp, tk, tp, g, K, False)).all())
        print(f"B={B:4d} V={V}: " + "  ".join(f"{k} {v:6.1f}" for k, v in row.items()) + f" us; same draws {same}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 1:
        micro()
        sys.exit(0)
    model._sample_ids = sample_ids_sort
    from triton_qwen3_tts.tools.bench_model import main

    sys.exit(main(sys.argv[1:]))
