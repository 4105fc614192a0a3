#!/usr/bin/env python
"""Check the stateful codec's CUDA-graph runner against the eager step, and time both (GPU).

    python scripts/check_stateful_graphs.py --preset 1.7b-customvoice --device cuda \\
        [--dtype float32|bfloat16] [--batch 1 3 8 17 64] [--frames 1 2 4 8 16 25] [--iters 20]
    python scripts/check_stateful_graphs.py --checkpoint DIR ...     # real weights
    python scripts/check_stateful_graphs.py --preset tiny --device cpu --no-capture   # CPU smoke
    python scripts/check_stateful_graphs.py --dtype bfloat16 --channels-last   # codec_channels_last

Per (B, T): B streams at different positions (a real, non-zero state: each row has decoded
a different number of frames first), the runner's step (graph replay for the padded batch
bucket) against the eager ``sd.step`` on the same unpadded batch: max |diff| of the audio and,
over every state tensor, the max |diff| relative to max(1, |state|). Then one stream of 150 frames
in chunks 2, 4, 8, 16, 25, ..., 1 through the runner against ``decoder.decode`` of the whole
utterance (exact decoding: the graphs must not change that). Timings: median ms per call of the
eager step and of the runner's step (staging copies, replay and output clones included).

``--channels-last``: the runner's decoder runs its vocoder on channels-last tensors
(``codec_channels_last``) while the eager reference keeps the reference layout, so the check
covers both the layout and the graphs. TF32 is off. Tolerances: fp32 1e-4 (audio, state relative), bf16 / fp16 3e-2. Exit 0 when every
check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOLERANCES = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 3e-2}


def _load(args, torch):
    if args.checkpoint:
        from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder

        return load_codec_decoder(args.checkpoint, "cpu", torch.float32)[0]
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig

    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    return init_random_codec_weights(CodecDecoder(cfg), args.seed).float().eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="checkpoint directory (official layout)")
    src.add_argument("--preset", default="1.7b-customvoice", help="random weights of a presets.py size")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32", choices=sorted(TOLERANCES))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 3, 8, 17, 64])
    ap.add_argument("--frames", type=int, nargs="+", default=[1, 2, 4, 8, 16, 25])
    ap.add_argument(
        "--batch-buckets", type=int, nargs="+", default=None, help="default: 1 2 4 8 16 32 64 up to the largest --batch"
    )
    ap.add_argument("--channels-last", action="store_true", help="the runner's vocoder channels-last")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=None, help="override the tolerance")
    ap.add_argument("--no-capture", action="store_true", help="run the runner's padded path eagerly (CPU smoke)")
    args = ap.parse_args(argv)

    import torch

    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner, batch_buckets_for, graph_key

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    if any(b < 1 for b in args.batch) or any(t < 1 for t in args.frames):
        print("error: --batch and --frames must be >= 1", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    tol = TOLERANCES[args.dtype] if args.tol is None else args.tol
    dec = _load(args, torch).to(dev, dtype).eval()
    sd = StatefulCodecDecoder(dec).eval()  # the eager reference
    fast = StatefulCodecDecoder(dec, channels_last=args.channels_last).eval()
    frames = sorted(set(args.frames))
    buckets = tuple(args.batch_buckets) if args.batch_buckets else batch_buckets_for(max(args.batch))
    runner = StatefulGraphRunner(fast, dev, dtype, buckets, frames, capture=not args.no_capture)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    runner.warmup()
    sync()
    print(
        f"decoder {args.checkpoint or args.preset} on {dev} {args.dtype}"
        f"{' (runner channels-last)' if args.channels_last else ''}; batch buckets {buckets}, frames {frames}; "
        f"{len(runner.captured)} graphs captured in {time.perf_counter() - t0:.1f}s; tolerance {tol:g}"
    )
    if dev.type == "cuda":
        print(
            f"GPU memory allocated {torch.cuda.memory_allocated(dev) / 2**30:.2f} GiB, "
            f"reserved {torch.cuda.memory_reserved(dev) / 2**30:.2f} GiB"
        )
    size = dec.config.codebook_size
    gen = torch.Generator().manual_seed(args.seed)

    def codes(b, t):
        return torch.randint(0, size, (b, t, 16), generator=gen).to(dev)

    def timed(fn):
        for _ in range(2):
            fn()
        ts = []
        for _ in range(args.iters):
            sync()
            t1 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t1)
        ts.sort()
        return ts[len(ts) // 2] * 1e3

    ok = True
    print(
        f"{'B':>4} {'T':>3} {'bucket':>6} {'audio max|d|':>13} {'state max rel|d|':>17} "
        f"{'eager ms':>9} {'graph ms':>9} {'x':>5}"
    )
    with torch.inference_mode():
        for b in args.batch:
            # rows at different positions: row i has decoded (5 * i) % 90 frames
            rows = []
            for i in range(b):
                st = sd.init_state(1, dev, dtype)
                p = (5 * i) % 90
                if p:
                    _, st = sd.step(codes(1, p), st)
                rows.append(st)
            state = {n: torch.cat([r[n] for r in rows]) for n in sd.state_names()}
            for t in frames:
                c = codes(b, t)
                calls = runner.graph_calls
                got_a, got_s = runner.step(c, state)
                via_graph = runner.graph_calls > calls
                ref_a, ref_s = sd.step(c, state)
                da = (got_a.double() - ref_a.double()).abs().max().item()
                ds = 0.0
                for n in sd.state_names():
                    scale = max(1.0, ref_s[n].abs().max().item())
                    ds = max(ds, (got_s[n].double() - ref_s[n].double()).abs().max().item() / scale)
                finite = bool(torch.isfinite(got_a).all())
                good = finite and da <= tol and ds <= tol
                ok &= good
                te = timed(lambda: sd.step(c, state))
                tg = timed(lambda: runner.step(c, state))
                key = graph_key(b, t, runner.batch_buckets, runner.frame_buckets)
                where = str(key[0]) if via_graph and key else "eager"
                print(
                    f"{b:4d} {t:3d} {where:>6} {da:13.3e} {ds:17.3e} "
                    f"{te:9.2f} {tg:9.2f} {te / tg:5.2f}{'' if good else '  FAIL' + ('' if finite else ' (NaN/Inf)')}"
                )

        # exactness of a whole stream through the runner (mixed T, some eager)
        n = 150
        stream = codes(2, n)
        sched, tot = [], 0
        for ch in [2, 4, 8, 16] + [25] * 10:
            ch = min(ch, n - tot - 1)
            if ch <= 0:
                break
            sched.append(ch)
            tot += ch
        sched.append(n - tot)
        st = runner.init_state(2)
        out, pos = [], 0
        for ch in sched:
            a, st = runner.step(stream[:, pos : pos + ch], st)
            out.append(a)
            pos += ch
        whole = dec.decode(stream)
        diff = torch.cat(out, dim=1).double() - whole.double()
        d = diff.abs().max().item()
        good = d <= tol
        ok &= good
        print(
            f"stream of {n} frames in chunks {sched} (2 rows) through the runner vs whole decode: "
            f"max |d| = {d:.3e}, rms |d| = {diff.pow(2).mean().sqrt().item():.3e} "
            f"(whole rms {whole.double().pow(2).mean().sqrt().item():.3e}) {'ok' if good else 'FAIL'}"
        )
    print(f"graph calls {runner.graph_calls}, eager fallbacks {runner.eager_calls}")
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
