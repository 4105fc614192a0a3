#!/usr/bin/env python
"""How busy the GPU was between the fused pipeline's periodic stats lines of a server log.

The tts model logs the fused pipeline's stats every 30 s (``tts fused pipeline gpu N: {...}``,
``serving/tts/triton.py``), with the engine's loop iterations (``steps``: one decode step an
iteration under load) and the device time of every kind of launch (``gpu_ms``: CUDA event pairs,
``engines/native/gputime.py``). Two consecutive lines give, for the interval between them:

- ``busy``: device time over wall time. Near 100 % the GPU, not the loop's host work, bounds the
  service: only less GPU time per request raises its capacity;
- ``ms/iter`` and ``gpu ms/iter``: wall and device time per loop iteration (their difference is
  the host time the overlap did not hide), and the device time per iteration split into decode
  steps, codec calls and prefills;
- ``prefills``: prefill launches, and the iterations per second;
- with the engine's ``loop_ms`` (host wall time of the loop's phases,
  ``engines/native/gputime.py`` ``LoopClock``), a second line per interval: the loop thread's
  milliseconds an iteration per phase, and its waits for the GPU (``wait_step``,
  ``wait_codec``, ``wait_prefill``: parts of the phases they happen in). Waits near zero while the GPU is not
  busy all the time: the host's work, not the GPU, bounds the iteration rate;
- with the engine's ``gpu_gap_ms`` (the GPU's time between one timed launch's end and the
  next one's start, by the pair of launch kinds: ``GpuTimer`` in ``engines/native/gputime.py``),
  a third line: those gaps' milliseconds an iteration, which says behind which launches the GPU
  waited for the host (``idle``: gaps of 50 ms or more, the loop without work).

    python scripts/gpu_busy.py docs/bench/run34/b/server.log.gz [--gpu 0]

A ``.gz`` log is read as is. Counters are cumulative over the server's life, so the first line's
interval (from the start) is not printed: only differences of two lines.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List

from triton_qwen3_tts.engines.native.gputime import kind_group

_LINE = re.compile(r"(\d\d):(\d\d):(\d\d(?:\.\d+)?)\s.*tts fused pipeline gpu (\d+): (\{.*\})")


@dataclass
class Stats:
    t: float  # seconds since midnight (the log's clock)
    steps: int
    ms: Dict[str, float]  # device ms per kind of launch
    calls: Dict[str, int]
    loop: Dict[str, float]  # host ms per loop phase (empty for logs from before loop_ms)
    loop_calls: Dict[str, int]
    gaps: Dict[str, float]  # the GPU's ms between launches per transition (empty for older logs)


def parse(lines: Iterable[str], gpu: int = 0) -> List[Stats]:
    """The stats lines of ``gpu``, in order. Triton's log escapes the JSON's quotes."""
    out = []
    for line in lines:
        m = _LINE.search(line)
        if not m or int(m.group(4)) != gpu:
            continue
        d = json.loads(m.group(5).replace('\\"', '"'))
        g = d.get("gpu_ms", {})
        out.append(
            Stats(
                t=int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)),
                steps=int(d.get("steps", 0)),
                ms={k: float(v["ms"]) for k, v in g.items()},
                calls={k: int(v["calls"]) for k, v in g.items()},
                loop={k: float(v["ms"]) for k, v in d.get("loop_ms", {}).items()},
                loop_calls={k: int(v["calls"]) for k, v in d.get("loop_ms", {}).items()},
                gaps={k: float(v["ms"]) for k, v in d.get("gpu_gap_ms", {}).items()},
            )
        )
    return out


def intervals(stats: List[Stats]) -> List[dict]:
    """Figures of each interval between two consecutive stats lines (module docstring)."""
    rows = []
    for a, b in zip(stats, stats[1:]):
        dt = (b.t - a.t) % 86400  # a log that runs past midnight
        iters = b.steps - a.steps
        by: Dict[str, float] = {}
        for k, v in b.ms.items():
            by[kind_group(k)] = by.get(kind_group(k), 0.0) + v - a.ms.get(k, 0.0)
        gpu_s = sum(by.values()) / 1000
        rows.append(
            {
                "seconds": dt,
                "busy_pct": 100 * gpu_s / dt if dt else float("nan"),
                "iterations": iters,
                "iter_per_s": iters / dt if dt else float("nan"),
                "ms_per_iter": 1000 * dt / iters if iters else float("nan"),
                "gpu_ms_per_iter": {k: v / iters for k, v in sorted(by.items())} if iters else {},
                "prefills": b.calls.get("prefill", 0) - a.calls.get("prefill", 0),
                "loop_ms_per_iter": _per_iteration(a, b),
                "gap_ms_per_iter": _per_iteration(a, b, "gaps"),
            }
        )
    return rows


def _per_iteration(a: Stats, b: Stats, field: str = "loop") -> Dict[str, float]:
    """``field``'s ms (the loop's host ms per phase, or the GPU's gaps per transition) between two
    lines, per loop iteration (its ``release`` laps: one per iteration, with or without a decode
    step; the decode steps for older logs)."""
    n = b.loop_calls.get("release", 0) - a.loop_calls.get("release", 0) or b.steps - a.steps
    before, after = getattr(a, field), getattr(b, field)
    return {k: (v - before.get(k, 0.0)) / n for k, v in sorted(after.items())} if n else {}


def _open(path: str):
    return gzip.open(path, "rt", errors="replace") if path.endswith(".gz") else open(path, errors="replace")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="a tritonserver log (plain or .gz) of a fused-pipeline server")
    ap.add_argument("--gpu", type=int, default=0, help="whose stats lines (one per GPU)")
    args = ap.parse_args(argv)
    with _open(args.log) as f:
        stats = parse(f, args.gpu)
    if len(stats) < 2:
        print(f"{args.log}: {len(stats)} stats line(s) of gpu {args.gpu}; need two (one every 30 s)", file=sys.stderr)
        return 1
    print(f"{'seconds':>8} {'busy':>6} {'iter/s':>7} {'ms/iter':>8} {'gpu ms/iter':>12}  split (ms/iter)  prefills")
    for r in intervals(stats):
        g = r["gpu_ms_per_iter"]
        split = " ".join(f"{k} {v:.2f}" for k, v in g.items())
        print(
            f"{r['seconds']:8.1f} {r['busy_pct']:5.0f}% {r['iter_per_s']:7.1f} {r['ms_per_iter']:8.2f} "
            f"{sum(g.values()):12.2f}  {split}  {r['prefills']}"
        )
        loop = r["loop_ms_per_iter"]
        if loop:
            waits = {k: v for k, v in loop.items() if k.startswith("wait_")}
            phases = " ".join(f"{k} {v:.2f}" for k, v in loop.items() if k not in waits)
            print(f"{'':>8} loop ms/iter: {phases}; waits {' '.join(f'{k} {v:.2f}' for k, v in waits.items())}")
        gaps = r["gap_ms_per_iter"]
        if gaps:
            print(f"{'':>8} gpu gaps ms/iter: {' '.join(f'{k} {v:.2f}' for k, v in gaps.items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
