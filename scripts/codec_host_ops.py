#!/usr/bin/env python
"""Count the tensor operations the host issues per resident codec call, around the decode itself:
the pool's state into the graph runner's static input and back, with ``step_pool`` (one gather and
one scatter) and with the per-name path (``pool.gather``, ``runner.step``, ``pool.scatter``).

    python scripts/codec_host_ops.py [--preset 1.7b-customvoice] [--rows 1 8 32] [--frames 4]

On a GPU each operation is at least one kernel launch and a few microseconds of the engine
thread's time, during which the GPU can sit idle between the codec call and the next talker step.
The decoder is built from the preset's config on the meta device (no weights; only its state
layout is used) and its step is replaced by one that returns silence, so only the staging is
counted. Counts are aten operations (``TorchDispatchMode``), the same on any machine; in brackets
those that only make a view (host time, no kernel).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def count_ops(fn) -> Counter:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1.7b-customvoice", help="model preset whose codec layout is used")
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 8, 32], help="streams per call")
    ap.add_argument("--frames", type=int, default=4, help="new frames per stream")
    args = ap.parse_args(argv)

    import torch

    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder
    from triton_qwen3_tts.model.config import SpeechTokenizerConfig
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner
    from triton_qwen3_tts.serving.codec.stateful import StatePool

    st = SpeechTokenizerConfig.from_dict(presets.speech_tokenizer_config(args.preset))
    with torch.device("meta"):
        sd = StatefulCodecDecoder(CodecDecoder(st.decoder))
    top = max(args.rows)
    buckets = tuple(sorted({1, 2, 4, 8, 16, 32, 64, top}))
    runner = StatefulGraphRunner(sd, "cpu", torch.float32, buckets, (args.frames,), capture=False)
    spf = runner.samples_per_frame
    runner._body = lambda slot: torch.zeros(slot.codes.shape[0], slot.codes.shape[1] * spf)
    pool = StatePool(sd, top, "cpu", torch.float32)
    for sid in range(top):
        pool.open(sid)
    names = len(sd.state_names())
    print(f"{args.preset} codec: {names} state tensors, {pool.row_numel:,} floats per stream")
    print("rows  step_pool ops (views)  per-name ops (views)")
    for b in args.rows:
        rows = list(range(b))
        codes = torch.zeros((b, args.frames, 16), dtype=torch.long)
        runner._slot(*_key(runner, b, args.frames))  # made before counting, as the warm-up does

        def fast():
            runner.step_pool(codes, pool, rows, pool.index(rows))

        def per_name():
            idx = pool.index(rows)
            audio, new = runner.step(codes, pool.gather(rows, idx))
            pool.scatter(rows, new, idx)

        f, p = count_ops(fast), count_ops(per_name)
        print(f"{b:4d}  {sum(f.values()):9d} ({_views(f):3d})  {sum(p.values()):8d} ({_views(p):3d})")
    print("the per-name path's operations:", dict(p.most_common()))
    return 0


# operations that only make a view (no kernel on a GPU, host time only)
VIEWS = {"view", "slice", "select", "narrow", "reshape", "_reshape_alias", "as_strided", "alias", "unsqueeze", "t"}


def _views(ops: Counter) -> int:
    return sum(n for op, n in ops.items() if op in VIEWS)


def _key(runner, b, t):
    from triton_qwen3_tts.serving.codec.graphs import graph_key

    return graph_key(b, t, runner.batch_buckets, runner.frame_buckets)


if __name__ == "__main__":
    sys.exit(main())
