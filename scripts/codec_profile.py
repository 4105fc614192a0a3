#!/usr/bin/env python
"""Where the stateful codec's call spends its GPU time, one slot (default 32 streams x 25 new frames,
the codec goal's).

    python scripts/codec_profile.py [--preset 1.7b-customvoice] [--batch 32] [--frames 25] \\
        [--compile] [--json out.json]
    python scripts/codec_profile.py --preset tiny --device cpu --batch 2 --frames 4   # smoke

Random weights of the preset (no checkpoint needed; timings carry over), bf16, the streams 72
frames in (a full attention window). It prints:

* every leaf module of one eager step (CUDA events around its forward through hooks): calls,
  microseconds, and for the convolutions their FLOPs and TFLOP/s, summed by stage (the
  pre-transformer, the two upsample stages, each vocoder block);
* the eager step's kernel table under ``torch.profiler`` (with ``cudnn.benchmark`` on);
* for each convolution shape, a GEMM of the same FLOPs through cuBLAS (``[rows, k*cin] x [k*cin,
  cout]``, what an implicit-GEMM kernel could approach);
* with ``--compile``: the serving slot (``StatefulGraphRunner``, the compiled step inside a CUDA
  graph, as ``codec_compile`` runs it) timed over replays, and its kernel table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def conv_flops(mod, out_shape) -> float:
    """Multiply-adds x 2 of a Conv1d / ConvTranspose1d / Linear forward with this output shape."""
    import torch.nn as nn

    if isinstance(mod, nn.Conv1d):
        b, co, lo = out_shape
        return 2.0 * b * co * lo * (mod.in_channels // mod.groups) * mod.kernel_size[0]
    if isinstance(mod, nn.ConvTranspose1d):
        b, co, lo = out_shape
        # each output sample sums kernel/stride input frames
        return 2.0 * b * co * lo * mod.in_channels * (mod.kernel_size[0] / mod.stride[0])
    if isinstance(mod, nn.Linear):
        rows = 1
        for s in out_shape[:-1]:
            rows *= s
        return 2.0 * rows * mod.in_features * mod.out_features
    return 0.0


def stage_of(name: str) -> str:
    parts = name.split(".")
    if parts[1] in ("decoder", "upsample"):
        return ".".join(parts[1:3])
    return parts[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1.7b-customvoice")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument(
        "--no-channels-last",
        dest="channels_last",
        action="store_false",
        help="codec_channels_last false: the vocoder in the reference [batch, channels, samples] layout (the "
        "per-module table needs it: the channels-last vocoder calls no leaf module)",
    )
    ap.add_argument("--compile", action="store_true", help="also the compiled slot inside its CUDA graph")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    import torch
    import torch.nn as nn

    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.tools.bench_model import kernel_table

    dev = torch.device(args.device)
    gpu = dev.type == "cuda"
    dtype = getattr(torch, args.dtype)
    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(cfg), 0).to(dev, dtype).eval()
    sd = StatefulCodecDecoder(dec, channels_last=args.channels_last).eval()
    torch.backends.cudnn.benchmark = gpu
    g = torch.Generator().manual_seed(0)
    B, T = args.batch, args.frames
    audio_s = B * T * 0.08
    out = {"args": vars(args)}

    def sync():
        if gpu:
            torch.cuda.synchronize(dev)

    with torch.inference_mode():
        state = sd.init_state(B, dev, dtype)
        _, state = sd.step(torch.randint(0, cfg.codebook_size, (B, 72, 16), generator=g).to(dev), state)
        codes = torch.randint(0, cfg.codebook_size, (B, T, 16), generator=g).to(dev)

        def step():
            return sd.step(codes, state)

        for _ in range(3):
            step()
        sync()
        ts = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            step()
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
        eager_ms = statistics.median(ts)
        print(f"eager step {B}x{T}: {eager_ms:.3f} ms ({audio_s / eager_ms * 1e3:.0f} audio-s/s), wall, synchronised")
        out["eager_ms"] = eager_ms

        # ---- leaf modules through hooks ------------------------------------------------------------
        rec = {}
        leaves = [(n, m) for n, m in sd.named_modules() if not list(m.children())]

        def pre(name):
            def hook(mod, inp):
                if gpu:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    rec.setdefault(name, []).append([e, None, None])
                else:
                    rec.setdefault(name, []).append([time.perf_counter(), None, None])

            return hook

        def post(name):
            def hook(mod, inp, res):
                r = rec[name][-1]
                if gpu:
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    r[1] = e
                else:
                    r[1] = time.perf_counter()
                r[2] = tuple(res.shape) if torch.is_tensor(res) else None

            return hook

        handles = []
        for n, m in leaves:
            handles.append(m.register_forward_pre_hook(pre(n)))
            handles.append(m.register_forward_hook(post(n)))
        step()
        sync()
        mods = dict(leaves)
        rows = []
        for n, calls in rec.items():
            us = sum((a.elapsed_time(b) * 1e3 if gpu else (b - a) * 1e6) for a, b, _ in calls)
            fl = sum(conv_flops(mods[n], s) for _, _, s in calls if s)
            rows.append(
                {
                    "module": n,
                    "type": type(mods[n]).__name__,
                    "calls": len(calls),
                    "us": us,
                    "gflop": fl / 1e9,
                    "out_shape": calls[-1][2],
                }
            )
        for h in handles:
            h.remove()
        hooked_us = sum(r["us"] for r in rows)
        print(f"\nleaf modules (hooks, one eager step): {hooked_us / 1e3:.3f} ms of {eager_ms:.3f}")
        print(f"{'us':>9} {'GFLOP':>8} {'TFLOP/s':>8}  module (type, out shape)")
        for r in sorted(rows, key=lambda r: -r["us"])[:40]:
            tf = r["gflop"] / r["us"] * 1e-3 if r["us"] and r["gflop"] else 0.0
            print(f"{r['us']:>9.1f} {r['gflop']:>8.1f} {tf:>8.1f}  {r['module']} ({r['type']}, {r['out_shape']})")
        stages = {}
        for r in rows:
            s = stages.setdefault(stage_of(r["module"]), {"us": 0.0, "conv_us": 0.0, "snake_us": 0.0, "gflop": 0.0})
            s["us"] += r["us"]
            s["gflop"] += r["gflop"]
            if r["type"] in ("Conv1d", "ConvTranspose1d"):
                s["conv_us"] += r["us"]
            if r["type"] == "SnakeBeta":
                s["snake_us"] += r["us"]
        print(f"\n{'stage':<14} {'us':>9} {'conv us':>9} {'snake us':>9} {'GFLOP':>8}")
        for k, s in stages.items():
            print(f"{k:<14} {s['us']:>9.1f} {s['conv_us']:>9.1f} {s['snake_us']:>9.1f} {s['gflop']:>8.1f}")
        out["modules"], out["stages"] = rows, stages

        # ---- the same FLOPs as one cuBLAS GEMM per distinct conv shape --------------------------------
        if gpu:
            gem = []
            seen = set()
            for r in rows:
                m = mods[r["module"]]
                if not isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) or not r["out_shape"]:
                    continue
                b, co, lo = r["out_shape"]
                taps = m.kernel_size[0] // (m.stride[0] if isinstance(m, nn.ConvTranspose1d) else 1)
                key = (type(m).__name__, m.in_channels, co, taps, b * lo)
                if key in seen:
                    continue
                seen.add(key)
                a = torch.randn(b * lo, m.in_channels * taps, device=dev, dtype=dtype)
                w = torch.randn(m.in_channels * taps, co, device=dev, dtype=dtype)
                for _ in range(3):
                    a @ w
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(10):
                    a @ w
                e1.record()
                e1.synchronize()
                us = e0.elapsed_time(e1) * 100
                fl = 2.0 * b * lo * m.in_channels * taps * co
                gem.append(
                    {
                        "conv": key[0],
                        "cin": key[1],
                        "cout": co,
                        "taps": taps,
                        "rows": b * lo,
                        "gemm_us": us,
                        "tflops": fl / us * 1e-6,
                        "in_situ_us": r["us"] / r["calls"],
                    }
                )
            print(
                f"\n{'conv':<16} {'cin':>5} {'cout':>5} {'taps':>4} {'rows':>9} {'in situ us':>10} {'GEMM us':>8} {'TFLOP/s':>8}"
            )
            for x in gem:
                print(
                    f"{x['conv']:<16} {x['cin']:>5} {x['cout']:>5} {x['taps']:>4} {x['rows']:>9} "
                    f"{x['in_situ_us']:>10.1f} {x['gemm_us']:>8.1f} {x['tflops']:>8.1f}"
                )
            out["gemm_equivalent"] = gem

            # ---- kernel table of the eager step ------------------------------------------------------
            from torch.profiler import ProfilerActivity, profile

            def table(fn, n):
                fn()
                sync()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(n):
                        fn()
                    sync()
                ev = [
                    (e.name, getattr(e, "device_time", None) or e.cuda_time)
                    for e in prof.events()
                    if str(getattr(e, "device_type", "")).endswith("CUDA") and e.name
                ]
                return kernel_table(ev, n, top=40)

            def show(title, kt, ms):
                print(
                    f"\n{title}: {kt['kernels_per_step']:.0f} kernels, {kt['busy_ms_per_step']:.3f} ms busy in {ms:.3f} ms"
                )
                print(f"{'us/call':>9} {'launches':>9}  kernel")
                for r in kt["top"]:
                    print(f"{r['us_per_step']:>9.1f} {r['per_step']:>9.1f}  {r['name'][:150]}")

            kt = table(step, 5)
            show("eager step kernels", kt, eager_ms)
            out["eager_kernels"] = kt

    if args.compile and gpu:
        from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner

        runner = StatefulGraphRunner(sd, dev, dtype, (B,), (T,), capture=True, compile=True)
        t0 = time.perf_counter()
        slot = runner._slot(B, T)
        sync()
        warm = time.perf_counter() - t0
        times = []
        for i in range(args.iters + 3):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            slot.graph.replay()
            e1.record()
            e1.synchronize()
            if i >= 3:
                times.append(e0.elapsed_time(e1))
        ms = statistics.median(times)
        print(
            f"\ncompiled slot {B}x{T}: warm-up {warm:.1f} s, {ms:.3f} ms a replay, {audio_s / ms * 1e3:.0f} audio-s/s"
        )
        out["compiled_ms"] = ms
        with torch.inference_mode():
            kt = table(slot.graph.replay, 5)
        show("compiled slot kernels", kt, ms)
        out["compiled_kernels"] = kt
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
