#!/usr/bin/env python
"""Would the fused pipeline's codec calls hide behind its talker steps on a second CUDA stream?

The fused pipeline runs talker steps and codec calls one after the other on one stream. A talker
step is ~400 small, latency-bound kernels that leave most SMs idle; a codec call is convolution
and elementwise work over many SMs. This probe replays, in one process, the native engine's
decode-step graph (random real-size talker) and the stateful codec's graphs (random real-size
decoder, ``warm_stateful_codec`` as the service builds it) in three arrangements:

- ``serial``: both on one stream, alternating (what the fused pipeline does now);
- ``overlap``: steps on one stream, codec calls on another, same priority;
- ``prio``: steps on a high-priority stream, codec calls on a low-priority one.

For each step batch ``--batch`` and codec shape ``--calls BxT`` it queues ``--steps`` step replays
and as many codec calls as take about the same time alone, and prints the median step and codec
times (CUDA events), the wall time of the whole, and the wall time against the sum of the parts
alone (1.00: no overlap; 0.50: the smaller half hidden completely).

    python scripts/stream_overlap_probe.py --preset 1.7b-customvoice --batch 32 64 \\
        --calls 2x2 8x25 32x25 --compile --codec-compile --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_qwen3_tts.engines.native.options import KERNELS  # noqa: E402


def _median(xs):
    return float(statistics.median(xs)) if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--preset", default="1.7b-customvoice")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 64], help="talker step batch buckets")
    ap.add_argument("--calls", nargs="+", default=["2x2", "8x25", "32x25"], help="codec call shapes BxT")
    ap.add_argument("--steps", type=int, default=60, help="step replays per arrangement")
    ap.add_argument("--ctx", type=int, default=120, help="the steps' context length")
    ap.add_argument("--compile", action="store_true", help="torch.compile the talker blocks (as the service)")
    ap.add_argument("--kernels", default="triton", choices=KERNELS, help="the decode step's layers")
    ap.add_argument("--codec-compile", action="store_true", help="compile the codec graphs (as the service)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    shapes = []
    for c in args.calls:
        parts = c.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            ap.error(f"--calls takes shapes like 2x2 or 8x25 (batch x frames), got {c!r}")
        shapes.append((int(parts[0]), int(parts[1])))

    import torch

    if not torch.cuda.is_available():
        print("error: this probe needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig
    from triton_qwen3_tts.engines.native.graphs import _Graphs
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import graph_key, warm_stateful_codec
    from triton_qwen3_tts.tools import bench_model

    bench_model._import_torch()
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    ns = argparse.Namespace(random_preset=args.preset, device="cuda", dtype="bfloat16")
    cfg = NativeEngineConfig(
        max_num_seqs=max(args.batch),
        max_model_len=1024,
        device="cuda",
        dtype="bfloat16",
        cuda_graphs=False,
        compile=args.compile,
        kernels=args.kernels,
        batch_buckets=tuple(sorted(set(args.batch))),
    )
    eng = NativeEngine(None, cfg, talker=bench_model.random_talker(ns)[0])
    eng._load()
    m = eng.model
    C = min(c for c in cfg.ctx_sizes() if c >= args.ctx + 2)
    # the engine's own capture (warm-up on a side stream, one memory pool, largest first); every
    # replay steps from the same context. It resets the slot tables afterwards: fill them then.
    graphs = _Graphs(m)
    graphs.capture(lambda B: (m.pos.fill_(args.ctx), m.step(B, C, False)), [(B,) for B in set(args.batch)])
    bench_model.fill_random_state(m, args.ctx, 1.0, torch.Generator(device="cpu").manual_seed(0))
    steps = {B: graphs.graphs[(B,)] for B in sorted(set(args.batch), reverse=True)}
    print(f"talker graphs ready in {time.perf_counter() - t0:.1f} s (compile {args.compile}, kernels {args.kernels})")

    t0 = time.perf_counter()
    ccfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(ccfg), 0).to("cuda", torch.bfloat16).eval()
    sd = StatefulCodecDecoder(dec)
    frame_buckets = sorted({t for _, t in shapes})
    runner = warm_stateful_codec(
        sd, "cuda", torch.bfloat16, True, max(b for b, _ in shapes), frame_buckets, compile=args.codec_compile
    )
    codec = {}
    with torch.inference_mode():  # the runner's buffers are inference tensors
        for b, t in shapes:
            slot = runner._slot(*graph_key(b, t, runner.batch_buckets, runner.frame_buckets))
            slot.codes.copy_(torch.randint(0, ccfg.codebook_size, slot.codes.shape, device=dev))
            codec[(b, t)] = slot
    torch.cuda.synchronize()
    print(f"codec graphs ready in {time.perf_counter() - t0:.1f} s (compile {args.codec_compile})")

    def ev():
        return torch.cuda.Event(enable_timing=True)

    def timed(n, fn, stream, marks):
        """Queue ``n`` calls of ``fn`` on ``stream``, each between two events (``marks``)."""
        with torch.cuda.stream(stream):
            for _ in range(n):
                a, e = ev(), ev()
                a.record()
                fn()
                e.record()
                marks.append((a, e))

    def alone(fn, n):
        marks = []
        s = torch.cuda.Stream(device=dev)
        timed(3, fn, s, [])
        timed(n, fn, s, marks)
        torch.cuda.synchronize()
        return _median([a.elapsed_time(e) for a, e in marks])

    hi_prio = min(torch.cuda.Stream.priority_range())  # lower numbers are higher priorities
    rows = []
    with torch.inference_mode():
        for B, g in steps.items():
            step_ms = alone(g.replay, 30)
            for (b, t), slot in codec.items():
                call = lambda slot=slot: runner._run(slot)  # noqa: E731
                codec_ms = alone(call, 20)
                n_steps = args.steps
                n_codec = max(1, round(n_steps * step_ms / codec_ms))
                row = {"B": B, "call": f"{b}x{t}", "step_alone_ms": step_ms, "codec_alone_ms": codec_ms}
                row["n_steps"], row["n_codec"] = n_steps, n_codec
                parts_ms = n_steps * step_ms + n_codec * codec_ms
                for mode in ("serial", "overlap", "prio"):
                    torch.cuda.synchronize()
                    if mode == "serial":
                        s1 = s2 = torch.cuda.Stream(device=dev)
                    elif mode == "overlap":
                        s1, s2 = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
                    else:
                        s1 = torch.cuda.Stream(device=dev, priority=hi_prio)
                        s2 = torch.cuda.Stream(device=dev, priority=0)
                    start = ev()
                    start.record(torch.cuda.current_stream(dev))
                    s1.wait_event(start)
                    s2.wait_event(start)
                    sm, cm = [], []
                    if mode == "serial":  # alternate, as the fused loop does
                        k = 0
                        for i in range(n_steps):
                            timed(1, g.replay, s1, sm)
                            while k < n_codec and k * n_steps <= i * n_codec:
                                timed(1, call, s2, cm)
                                k += 1
                        timed(n_codec - k, call, s2, cm)
                    else:
                        # interleave the host's queueing so that neither stream waits for the other
                        per = max(1, n_steps // 10)
                        k = 0
                        for i in range(0, n_steps, per):
                            timed(min(per, n_steps - i), g.replay, s1, sm)
                            want = round((i + per) * n_codec / n_steps)
                            timed(max(0, min(want, n_codec) - k), call, s2, cm)
                            k = max(k, min(want, n_codec))
                        timed(n_codec - k, call, s2, cm)
                    end1, end2 = ev(), ev()
                    end1.record(s1)
                    end2.record(s2)
                    torch.cuda.synchronize()
                    wall = max(start.elapsed_time(end1), start.elapsed_time(end2))
                    row[mode] = {
                        "step_ms": _median([a.elapsed_time(e) for a, e in sm]),
                        "codec_ms": _median([a.elapsed_time(e) for a, e in cm]),
                        "wall_ms": wall,
                        "wall_vs_parts": wall / parts_ms,
                    }
                rows.append(row)
    print(
        f"\n{torch.cuda.get_device_name()}; high priority {hi_prio}; medians of CUDA-event-timed graph replays "
        f"(step context {args.ctx}, bucket {C})"
    )
    print(
        f"{'B':>4} {'call':>6} {'step':>6} {'codec':>6} | "
        + " | ".join(f"{m_:>7}: step  codec  wall/parts" for m_ in ("serial", "overlap", "prio"))
    )
    for r in rows:
        cells = [
            f"{r[m_]['step_ms']:14.2f} {r[m_]['codec_ms']:6.2f} {r[m_]['wall_vs_parts']:11.2f}"
            for m_ in ("serial", "overlap", "prio")
        ]
        print(f"{r['B']:>4} {r['call']:>6} {r['step_alone_ms']:6.2f} {r['codec_alone_ms']:6.2f} | " + " | ".join(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "high_priority": hi_prio, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
