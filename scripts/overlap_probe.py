#!/usr/bin/env python
"""Does the codec's graph run beside the talker's frame step on a second CUDA stream, and for how much?

    python scripts/overlap_probe.py --preset 1.7b-customvoice [--rows 64] [--codec 16:16 32:16] [--json out.json]

The fused pipeline runs the frame step and the stateful codec's calls on one stream, one after the
other. The step at many rows is hundreds of short, latency-bound kernels that leave
multiprocessors idle, so the codec's kernels could fill them if the two graphs were replayed on
two streams. This probe captures the frame step at ``--rows`` rows (compiled blocks, the Triton
kernels: the server's configuration) and the compiled stateful codec's slot of each ``--codec
B:T``, and times, per slot, as medians of CUDA-event-timed rounds:

- ``step``, ``codec``: each alone;
- ``serial``: step then codec on one stream (what the pipeline does now);
- ``overlap``: the two replayed at once on two streams, the round ending when both have;
  ``step_in_overlap``: when the step's stream got through its step (the talker's latency then);
- the same with the codec's stream at a lower priority than the step's (``overlap_lowprio``).

``saved`` is ``1 - overlap / serial``: the share of the pair's GPU time the second stream hides.
GPU only; random real-size weights (no checkpoint).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _capture(fn, dev, torch):
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.inference_mode():
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    torch.cuda.synchronize(dev)
    return g


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1.7b-customvoice")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--rows", type=int, default=64, help="rows of the frame step")
    ap.add_argument("--ctx", type=int, default=300, help="the step's context (KV positions)")
    ap.add_argument("--codec", nargs="+", default=["16:16", "32:16", "8:16"], metavar="B:T")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner, batch_buckets_for
    from triton_qwen3_tts.serving.codec.runtime import torch_dtype
    from triton_qwen3_tts.tools import bench_model
    from triton_qwen3_tts.tools.bench_model import fill_random_state, random_talker

    bench_model._import_torch()  # its module-level torch is bound on first use

    dev = torch.device(args.device)
    if dev.type != "cuda":
        raise SystemExit("overlap_probe.py needs a CUDA device")
    t00 = time.perf_counter()
    B = args.rows
    talker, _ = random_talker(SimpleNamespace(random_preset=args.preset, device=args.device, dtype=args.dtype))
    cfg = NativeEngineConfig(
        max_num_seqs=B,
        max_model_len=1024,
        device=args.device,
        dtype=args.dtype,
        cuda_graphs=False,
        compile=True,
        kernels="triton",
        batch_buckets=(B,),
    )
    eng = NativeEngine(None, cfg, talker=talker)
    eng._load()
    m = eng.model
    C = min(c for c in cfg.ctx_sizes() if c >= args.ctx + 2)
    fill_random_state(m, args.ctx, 1.0, torch.Generator(device="cpu").manual_seed(0))
    step = _capture(lambda: m.step(B, C, False), dev, torch)
    print(f"step graph ({B} rows, context bucket {C}) after {time.perf_counter() - t00:.0f} s", flush=True)

    slots = [tuple(int(v) for v in s.split(":")) for s in args.codec]
    dcfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    dtype = torch_dtype(args.dtype)
    decoder = init_random_codec_weights(CodecDecoder(dcfg), 0).to(dev, dtype).eval()
    sd = StatefulCodecDecoder(decoder, channels_last=True).eval()
    runner = StatefulGraphRunner(
        sd,
        dev,
        dtype,
        batch_buckets_for(max(b for b, _ in slots)),
        tuple(sorted({t for _, t in slots})),
        capture=True,
        compile=True,
        compile_backend="inductor",
    )
    torch.backends.cudnn.benchmark = True

    main_s = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(device=dev)
    # a lower number is a higher priority; values past the device's range map to its ends
    side_low = torch.cuda.Stream(device=dev, priority=0)
    main_hi = torch.cuda.Stream(device=dev, priority=-100)

    def ev():
        return torch.cuda.Event(enable_timing=True)

    def reset():
        m.pos.fill_(args.ctx)

    def rounds(body) -> dict:
        """Median ms of each named interval ``body`` returns (start event, {name: end event})."""
        out: dict = {}
        for i in range(args.iters + 5):
            start, ends = body()
            torch.cuda.synchronize(dev)
            if i >= 5:
                for k, e in ends.items():
                    out.setdefault(k, []).append(start.elapsed_time(e))
        return {k: round(statistics.median(v), 3) for k, v in out.items()}

    rows = []
    for b, t in slots:
        slot = runner._slot(b, t)
        torch.cuda.synchronize(dev)
        cg = slot.graph

        def alone(graph, pre=None):
            def body():
                if pre:
                    pre()
                s, e = ev(), ev()
                s.record()
                graph.replay()
                e.record()
                return s, {"ms": e}

            return body

        def serial():
            reset()
            s, e = ev(), ev()
            s.record()
            step.replay()
            cg.replay()
            e.record()
            return s, {"ms": e}

        def overlap(a_stream, b_stream):
            def body():
                reset()
                s, e_step, e_codec, e = ev(), ev(), ev(), ev()
                s.record(main_s)
                a_stream.wait_event(s)
                b_stream.wait_event(s)
                with torch.cuda.stream(a_stream):
                    step.replay()
                    e_step.record(a_stream)
                with torch.cuda.stream(b_stream):
                    cg.replay()
                    e_codec.record(b_stream)
                main_s.wait_event(e_step)
                main_s.wait_event(e_codec)
                e.record(main_s)
                return s, {"ms": e, "step_in_overlap": e_step, "codec_in_overlap": e_codec}

            return body

        with torch.inference_mode():
            r_step = rounds(alone(step, reset))["ms"]
            r_codec = rounds(alone(cg))["ms"]
            r_serial = rounds(serial)["ms"]
            r_ov = rounds(overlap(main_s, side))
            r_lo = rounds(overlap(main_hi, side_low))
        row = dict(
            rows=B,
            codec_batch=b,
            codec_frames=t,
            step=r_step,
            codec=r_codec,
            serial=r_serial,
            overlap=r_ov["ms"],
            step_in_overlap=r_ov["step_in_overlap"],
            codec_in_overlap=r_ov["codec_in_overlap"],
            overlap_lowprio=r_lo["ms"],
            step_in_overlap_lowprio=r_lo["step_in_overlap"],
            codec_in_overlap_lowprio=r_lo["codec_in_overlap"],
        )
        row["saved"] = round(1 - row["overlap"] / row["serial"], 3)
        row["saved_lowprio"] = round(1 - row["overlap_lowprio"] / row["serial"], 3)
        rows.append(row)
        print(
            f"step {B} rows + codec {b}x{t}: step {r_step:.3f}, codec {r_codec:.3f}, serial {r_serial:.3f} ms; "
            f"two streams {row['overlap']:.3f} ms (step done at {row['step_in_overlap']:.3f}, saved "
            f"{row['saved']:.1%}); codec at low priority {row['overlap_lowprio']:.3f} ms (step done at "
            f"{row['step_in_overlap_lowprio']:.3f}, codec at {row['codec_in_overlap_lowprio']:.3f}, saved "
            f"{row['saved_lowprio']:.1%})",
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(json.dumps(dict(args=vars(args), rows=rows), indent=2))
    print(f"done in {time.perf_counter() - t00:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
