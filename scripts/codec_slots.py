#!/usr/bin/env python
"""Warm-up time and call time of every slot of the fused pipeline's stateful codec.

    python scripts/codec_slots.py --checkpoint /tmp/ckpt-1.7b-customvoice [--compile] \\
        [--max-batch 32] [--first-chunk-frames 2] [--chunk-ramp 2,4,8,16] [--chunk-frames 25] [--slots 32:25]
    python scripts/codec_slots.py --preset tiny --device cpu          # CPU smoke (no graphs)

The slots are those the fused pipeline warms at start (``serving/talker/engines.py``
``make_fused``): the batch buckets up to ``--max-batch`` times the frame counts of
``serving/talker/fused.py`` ``frame_buckets``. Per slot, in the warm-up's order: the seconds its
warm-up took (``cudnn.benchmark``'s trials, the CUDA-graph capture and, with ``--compile``, the
``torch.compile`` of the step where that slot triggered one), then the median of ``--iters``
calls (CUDA graph replays, CUDA-event timed; on the CPU the runner's padded eager path, wall
time) and the audio-seconds per second it decodes. With ``--compile`` the log also says how many
graphs dynamo compiled (run 29b: four, 50-70 s each, before batch 1 and one frame were kept away
from the compiled step).

bf16 by default (the GPU default of ``codec_dtype``); TF32 stays off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint directory (its speech_tokenizer decoder)")
    src.add_argument("--preset", help="random decoder weights of this preset (e.g. tiny, 1.7b-customvoice)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--compile", action="store_true", help="codec_compile: the compiled step inside the graphs")
    ap.add_argument(
        "--no-channels-last",
        dest="channels_last",
        action="store_false",
        help="codec_channels_last false: the vocoder in the reference [batch, channels, samples] layout",
    )
    ap.add_argument("--max-batch", type=int, default=32, help="codec_max_batch_size")
    ap.add_argument("--first-chunk-frames", type=int, default=2)
    ap.add_argument("--chunk-ramp", default="2,4,8,16")
    ap.add_argument("--chunk-frames", type=int, default=25)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="write the rows here (rewritten after every slot, so a run cut short keeps them)")
    ap.add_argument(
        "--slots",
        nargs="*",
        metavar="B:T",
        help="time only these slots (batch bucket:frames, e.g. 32:25, the codec goal's): the others are not "
        "warmed (with --compile the first slot timed still pays the compile)",
    )
    args = ap.parse_args(argv)
    only = None
    if args.slots:
        try:
            only = {tuple(int(v) for v in s.split(":")) for s in args.slots}
            if any(len(s) != 2 for s in only):
                raise ValueError
        except ValueError:
            ap.error(f"--slots: B:T pairs of integers, got {args.slots}")

    import torch
    import torch._dynamo

    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner, batch_buckets_for
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder, torch_dtype
    from triton_qwen3_tts.serving.talker.fused import frame_buckets

    device = torch.device(args.device)
    dtype = torch_dtype(args.dtype)
    gpu = device.type == "cuda"
    if args.checkpoint:
        decoder, _ = load_codec_decoder(args.checkpoint, device, dtype)
    else:  # as benchmark_codec.py: the preset's decoder with random weights
        cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
        decoder = init_random_codec_weights(CodecDecoder(cfg), 0).to(device, dtype).eval()
    sd = StatefulCodecDecoder(decoder, channels_last=args.channels_last and gpu).eval()
    ramp = tuple(int(x) for x in args.chunk_ramp.split(",") if x)
    fb = frame_buckets(args.first_chunk_frames, ramp, args.chunk_frames)
    runner = StatefulGraphRunner(
        sd,
        device,
        dtype,
        batch_buckets_for(args.max_batch),
        fb,
        capture=gpu,
        compile=args.compile,
        compile_backend="inductor" if gpu else "aot_eager",
    )
    if only is not None:
        have = {(b, t) for b in runner.batch_buckets for t in runner.frame_buckets}
        if not only <= have:
            ap.error(f"--slots {sorted(only - have)}: not a slot; slots: {sorted(have)}")
    torch._dynamo.utils.counters.clear()
    rows, t00 = [], time.perf_counter()

    def compiled() -> int:
        return torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)

    def write(rows, complete: bool) -> None:
        if args.json:
            doc = dict(args=vars(args), slots=rows, compiled_graphs=compiled(), complete=complete)
            Path(args.json).write_text(json.dumps(doc, indent=2))

    # the warm-up's order (StatefulGraphRunner.warmup): the largest slot first
    for b in reversed(runner.batch_buckets):
        for t in reversed(runner.frame_buckets):
            if only is not None and (b, t) not in only:
                continue
            t0 = time.perf_counter()
            slot = runner._slot(b, t)
            if gpu:
                torch.cuda.synchronize(device)
            warm = time.perf_counter() - t0
            times = []
            with torch.inference_mode():
                for i in range(args.iters + 3):
                    if gpu:
                        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                        ev[0].record()
                        slot.graph.replay()
                        ev[1].record()
                        ev[1].synchronize()
                        ms = ev[0].elapsed_time(ev[1])
                    else:
                        c0 = time.perf_counter()
                        runner._body(slot)
                        ms = (time.perf_counter() - c0) * 1000
                    if i >= 3:
                        times.append(ms)
            ms = statistics.median(times)
            row = dict(
                batch=b, frames=t, warm_s=round(warm, 2), ms=round(ms, 3), audio_s_per_s=round(b * t * 0.08 / ms * 1000)
            )
            rows.append(row)
            print(
                f"b={b:3d} t={t:3d}: warm-up {warm:6.1f} s, call {ms:8.3f} ms, {row['audio_s_per_s']:6d} audio-s/s, "
                f"elapsed {time.perf_counter() - t00:6.1f} s",
                flush=True,
            )
            write(rows, complete=False)
    write(rows, complete=True)
    print(f"{len(rows)} slots warmed in {time.perf_counter() - t00:.1f} s; dynamo compiled {compiled()} graph(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
