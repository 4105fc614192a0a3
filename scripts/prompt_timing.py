#!/usr/bin/env python
"""Time a prompt's build (tokenize, look up, project the text rows) with the projection on the CPU
and, where there is a GPU, on the GPU (the ``prompt_device`` setting), and compare their rows.

    python scripts/prompt_timing.py --checkpoint CKPT [--builds 200] [--threads 0]
    python scripts/prompt_timing.py --preset tiny          # writes a tiny random checkpoint first

Each build is one request's ``PromptFrontend.build`` as the talker service runs it (one of its
prompt threads), on the texts of ``tools/bench_model.py`` in turn (CustomVoice, the checkpoint's
first speaker). Prints milliseconds per build (median, p95) per device, and the largest absolute
difference between the devices' rows. ``--threads`` sets torch's CPU threads (0: torch's default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint directory (official layout)")
    src.add_argument("--preset", help="write a random checkpoint of this preset first (tiny: seconds)")
    ap.add_argument("--builds", type=int, default=200, help="timed builds per device (after 10 untimed)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from triton_qwen3_tts.model.frontend import PromptFrontend
    from triton_qwen3_tts.model.prompt import PromptRequest
    from triton_qwen3_tts.tools.bench_model import TEXTS

    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt = args.checkpoint
    if args.preset:
        from triton_qwen3_tts.tools.random_checkpoint import write_temp_checkpoint

        ckpt = write_temp_checkpoint(args.preset, prefix="prompt-timing-")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = {}
    print(f"torch threads {torch.get_num_threads()}; ms per build over {args.builds} builds")
    for dev in devices:
        fe = PromptFrontend(ckpt, project_device=dev)
        speaker = fe.config.speakers[0] if fe.config.speakers else None
        reqs = [
            fe.validate(PromptRequest(task_type=fe.config.task_type, text=t, language="English", speaker=speaker))
            for t in TEXTS
        ]
        for i in range(10):
            fe.build(reqs[i % len(reqs)])
        ms = []
        for i in range(args.builds):
            t0 = time.perf_counter()
            fe.build(reqs[i % len(reqs)])
            ms.append((time.perf_counter() - t0) * 1e3)
        built = [fe.build(r) for r in reqs]
        rows[dev] = [torch.cat([b.prompt_embeds, b.trailing]) for b in built]
        n = [b.prompt_embeds.shape[0] + b.trailing.shape[0] for b in built]
        print(
            f"{dev:5s} median {np.median(ms):7.3f}  p95 {np.percentile(ms, 95):7.3f}  "
            f"(rows per prompt {min(n)}-{max(n)})"
        )
    if len(devices) > 1:
        diff = max(float((a - b).abs().max()) for a, b in zip(rows["cpu"], rows["cuda"]))
        print(f"largest |cpu - cuda| of a row value: {diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
