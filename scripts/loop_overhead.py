#!/usr/bin/env python
"""Host time per scheduler iteration of the fused pipeline, with the GPU's work taken out.

    python scripts/loop_overhead.py --checkpoint CKPT [--streams 1 64] [--frames 300] [--repeat 3]
    python scripts/loop_overhead.py --preset tiny          # writes a tiny random checkpoint first

The native engine's loop (``engines/native/engine.py``) and the fused pipeline around it
(``serving/talker/fused.py``, deadline policy included) run as in the server, on the CPU, but
the decode step returns its frames at once and the codec call returns silence, so all that is
timed is the host's share of each iteration: admissions, the events, the policy, the hand-overs
between the loop and its worker thread. On a GPU that share runs while the GPU computes the
step launched before it (``native_overlap``); an iteration costs the longer of the two, and the
host's share on its own where a codec call is read back. ``--streams`` of
``--frames`` each start together; prints the median over ``--repeat`` runs of milliseconds per
iteration, and the codec calls (the policy's batching when every call is instant), for the loop
on a thread of its own (``native_loop_thread``) and in the event loop's executor
(``--loop-thread``). On its own thread the loop hands its frames to the event loop without
waiting, so the hand-over is not in its iterations (on the GPU it runs while the loop waits).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Pool:
    """The codec state pool's interface, holding nothing (the codec is taken out)."""

    live = 0

    def __init__(self, torch):
        self.buf = torch.zeros(1)

    def open(self, sid):
        pass

    def release(self, sid):
        pass


def run(checkpoint: str, streams: int, frames: int, loop_thread: bool = True) -> dict:
    import torch

    from triton_qwen3_tts.engines.base import TalkerRequest
    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig
    from triton_qwen3_tts.serving.talker import fused

    cfg = NativeEngineConfig(
        max_num_seqs=max(64, streams),
        max_model_len=frames + 64,
        device="cpu",
        dtype="float32",
        cuda_graphs=False,
        batch_buckets=(1, 8, 32, 64),
        max_trailing_tokens=16,
        loop_thread=loop_thread,
    )
    loop = asyncio.new_event_loop()
    eng = loop.run_until_complete(NativeEngine.create(checkpoint, cfg))

    out = eng.model.out
    out.zero_()  # no EOS flag

    def instant_step(B, C, top_p):  # the step's frames at once: code 7 everywhere
        out[:B, :16] = 7

    eng.model.step = instant_step
    saved = fused.run_resident_batch, fused.to_device_async
    fused.run_resident_batch = lambda reqs, pool, codec, **kw: [torch.zeros(q.codes.shape[1] * 1920) for q in reqs]
    fused.to_device_async = lambda t, device: t
    try:
        policy = fused.deadline_policy(2, (2, 4, 8, 16), 25, 400, 32)  # the recommended GPU settings
        pipe = fused.FusedPipeline(eng, None, _Pool(torch), policy)
        d = eng.model.D

        async def one(i):
            req = TalkerRequest(
                request_id=f"r{i}",
                prompt_embeds=torch.zeros(6, d),
                trailing=torch.zeros(3, d),
                max_frames=frames,
                greedy=True,
                suppress_eos=True,
            )
            sizes = [a.shape[0] // 1920 async for a in pipe.synthesize(req)]
            return len(sizes), sum(sizes)

        async def main():
            s0, t0 = eng.steps, time.perf_counter()
            got = await asyncio.gather(*[one(i) for i in range(streams)])
            return time.perf_counter() - t0, eng.steps - s0, sum(c for c, _ in got), sum(f for _, f in got)

        wall, steps, chunks, audio_frames = loop.run_until_complete(main())
        calls = pipe.fused_stats.codec_calls
    finally:
        fused.run_resident_batch, fused.to_device_async = saved
        task = eng._task
        eng.shutdown()
        if task is not None:  # let the cancelled scheduler finish before the loop closes
            loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        loop.close()
    return dict(
        ms_per_iteration=wall / steps * 1000, steps=steps, chunks=chunks, frames=audio_frames, codec_calls=calls
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint")
    src.add_argument("--preset", help="write a random checkpoint of this preset first (tiny: seconds)")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--loop-thread",
        choices=("true", "false", "both"),
        default="both",
        help="the engine's loop on a thread of its own (native_loop_thread), in the executor, or each in turn",
    )
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    ckpt = args.checkpoint
    if ckpt is None:
        from triton_qwen3_tts.tools.random_checkpoint import write_temp_checkpoint

        ckpt = write_temp_checkpoint(args.preset, prefix="loop-overhead-")
    modes = {"true": (True,), "false": (False,), "both": (False, True)}[args.loop_thread]
    for n in args.streams:
        for lt in modes:
            runs = [run(ckpt, n, args.frames, lt) for _ in range(args.repeat)]
            ms = statistics.median(r["ms_per_iteration"] for r in runs)
            r = runs[0]
            print(
                f"{n:3d} streams x {args.frames} frames, loop {'thread' if lt else 'in the executor'}: "
                f"{ms:.3f} ms of host time per iteration (median of {args.repeat}; {r['steps']} steps, "
                f"{r['codec_calls']} codec calls, {r['chunks']} chunks)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
