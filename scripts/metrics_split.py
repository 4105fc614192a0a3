#!/usr/bin/env python
"""Per-level figures from the server-metric snapshots that ``gpu_e2e_bench.sh`` writes with
``PER_LEVEL=1`` (``metrics_TAG_cL.txt``, one after each closed-loop level; Triton's counters are
cumulative, so each level is its snapshot minus the previous one).

    python scripts/metrics_split.py docs/bench/run11_final/metrics_fin_c{1,8,32,64}.txt

Per level: mean time to first audio and to the talker's first frames (the tts histograms
``qwen3_tts_time_to_first_{audio,frames}_seconds``), their difference (first codec call, send and
hops), and per model: requests, executions, mean batch, the time one execution took (Triton's
compute duration is counted per request, so compute / requests is the duration of the batch a
request was in), busy seconds (executions x that duration; an estimate that leans high, since
requests in larger, longer batches weigh more in the mean) and queue time per request. With the
fused pipeline's counters: the GPU's device time by group of launches (step, codec, prefill),
its gaps between launches under 50 ms by transition, and the share of the working time it was
busy (device time over device time plus those gaps; gaps of 50 ms and more are no work at all).

    python scripts/metrics_split.py --pairs before_1.txt after_1.txt before_2.txt after_2.txt

``--pairs``: the snapshots come in (before, after) pairs, one window each (such as the levels of
``scripts/gpu_ab_bench.sh``), instead of each one following the previous.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_qwen3_tts.engines.native.gputime import kind_group  # noqa: E402

_LINE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$")
MODELS = ("tts", "talker", "codec_decoder", "codec_decoder_stateful")


def parse(text: str) -> Dict[Tuple[str, str], float]:
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def _sum(d, name, label=""):
    return sum(v for (n, lab), v in d.items() if n == name and label in lab)


def level_figures(cur: Dict, prev: Dict) -> Dict[str, float]:
    def delta(name, label=""):
        return _sum(cur, name, label) - _sum(prev, name, label)

    fig = {}
    for key in ("audio", "frames"):
        s = delta(f"qwen3_tts_time_to_first_{key}_seconds_sum")
        c = delta(f"qwen3_tts_time_to_first_{key}_seconds_count")
        fig[f"first_{key}_ms"] = 1000 * s / c if c else float("nan")
        fig["requests"] = c or fig.get("requests", 0)
    for m in MODELS:
        lab = f'model="{m}"'
        n, e = delta("nv_inference_count", lab), delta("nv_inference_exec_count", lab)
        if not n:
            continue
        comp = delta("nv_inference_compute_infer_duration_us", lab) / 1000
        fig[f"{m}.requests"] = n
        fig[f"{m}.executions"] = e
        fig[f"{m}.batch"] = n / e if e else float("nan")
        fig[f"{m}.exec_ms"] = comp / n
        fig[f"{m}.busy_s"] = comp / n * e / 1000
        fig[f"{m}.queue_ms"] = delta("nv_inference_queue_duration_us", lab) / 1000 / n
    fig.update(device_figures(cur, prev))
    return fig


def device_figures(cur: Dict, prev: Dict) -> Dict[str, float]:
    """``device.<group>_s`` (device seconds by group of launch kinds), ``gap.<transition>_s``
    (gaps under 50 ms; ``gap.idle_s`` the longer ones) and ``busy_working`` (device seconds over
    device seconds plus the gaps under 50 ms), from the fused pipeline's counters; {} without."""
    fig: Dict[str, float] = {}
    for (name, lab), v in cur.items():
        if name == "qwen3_tts_fused_device_seconds_total":
            key = "device." + kind_group(re.search(r'kind="([^"]*)"', lab).group(1)) + "_s"
        elif name == "qwen3_tts_fused_device_gap_seconds_total":
            key = "gap." + re.search(r'transition="([^"]*)"', lab).group(1) + "_s"
        else:
            continue
        fig[key] = fig.get(key, 0.0) + v - prev.get((name, lab), 0.0)
    dev = sum(v for k, v in fig.items() if k.startswith("device."))
    gaps = sum(v for k, v in fig.items() if k.startswith("gap.") and k != "gap.idle_s")
    if dev > 0:
        fig["busy_working"] = dev / (dev + gaps)
    return fig


def device_line(f: Dict[str, float]) -> str:
    """The device figures of :func:`device_figures` as one line ('' without them)."""
    if "busy_working" not in f:
        return ""
    dev = {k[7:-2]: v for k, v in f.items() if k.startswith("device.")}
    gaps = {k[4:-2]: v for k, v in f.items() if k.startswith("gap.") and k != "gap.idle_s"}
    top = sorted(gaps.items(), key=lambda kv: -kv[1])
    return (
        f"GPU: {sum(dev.values()):.2f} s ("
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(dev.items()))
        + f"); gaps under 50 ms {sum(gaps.values()):.3f} s ("
        + ", ".join(f"{k} {v:.3f}" for k, v in top if v > 0)
        + f"); busy {100 * f['busy_working']:.1f} % of the working time"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("snapshots", nargs="+", help="metric snapshots in level order (text of /metrics)")
    ap.add_argument("--pairs", action="store_true", help="the snapshots are (before, after) pairs, one window each")
    args = ap.parse_args(argv)
    if args.pairs and len(args.snapshots) % 2:
        print("error: --pairs takes an even number of snapshots", file=sys.stderr)
        return 2
    prev: Dict = {}
    rows: List[str] = []
    for i, path in enumerate(args.snapshots):
        try:
            with open(path) as f:
                cur = parse(f.read())
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if not cur:
            print(f"error: {path} holds no Prometheus samples", file=sys.stderr)
            return 2
        if args.pairs and i % 2 == 0:  # a window's start
            prev = cur
            continue
        f = level_figures(cur, prev)
        level = re.search(r"_c(\d+)\.txt$", path)
        parts = [
            f"level {level.group(1) if level else path}: {int(f['requests'])} requests",
            f"TTFA {f['first_audio_ms']:.1f} ms = first frames {f['first_frames_ms']:.1f} + "
            f"{f['first_audio_ms'] - f['first_frames_ms']:.1f} (first codec call, send, hops)",
        ]
        for m in MODELS:
            if f"{m}.requests" in f:
                parts.append(
                    f"{m}: {int(f[m + '.requests'])} req / {int(f[m + '.executions'])} exec "
                    f"(batch {f[m + '.batch']:.1f}), {f[m + '.exec_ms']:.1f} ms per exec, "
                    f"busy {f[m + '.busy_s']:.1f} s, queue {f[m + '.queue_ms']:.1f} ms/req"
                )
        line = device_line(f)
        if line:
            parts.append(line)
        rows.append("\n  ".join(parts))
        prev = cur
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
