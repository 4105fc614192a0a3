#!/usr/bin/env python3
"""Throughput against GPU count, from ``qwen3-tts-bench-service`` JSON outputs of two servers.

``--one CLOSED OPEN`` are the one-GPU server's closed- and open-loop outputs, ``--many CLOSED OPEN``
those of the server over ``--gpus`` GPUs (``scripts/gpu_scaling_bench.sh`` writes all four; a
``.gz`` file is read gzipped).
Prints, per server, each closed-loop level (audio-s/s, TTFA p95, share of requests that
underran) and each open-loop rate with its capacity verdict, then ``scaling_2gpu_ratio``: the
many-GPU server's served audio-s/s at its capacity rate over the one-GPU server's at its own
(the capacity rate is the highest offered rate that kept TTFA p95 <= 100 ms, under 1 % of the
requests underrunning and none failed, as ``qwen3-tts-bench-service`` decides it). The ratio is
empty when either server has no capacity rate; when only the many-GPU server has none (it failed
even its lowest rate), ``scaling_2gpu_ratio_at_most`` bounds it: that server's capacity lies below
its lowest rate, so it serves less than it did there.

    python scripts/scaling_report.py --one closed_a.json open_a.json \\
        --many closed_b.json open_b.json --gpus 2 --out-json scaling.json
"""

from __future__ import annotations

import argparse
import gzip
import json
from typing import Optional


def _load(path: str) -> dict:
    """A benchmark JSON, plain or gzipped (``.gz``, as docs/bench keeps the large ones)."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)


def capacity_throughput(open_run: dict) -> Optional[float]:
    """Served audio-s/s at the run's capacity rate, or None when no rate passed."""
    rate = open_run.get("capacity_rps")
    if rate is None:
        return None
    for level in open_run["levels"]:
        if level["level"] == rate:
            return level["audio_s_per_s"]
    raise ValueError(f"capacity rate {rate} is not one of the run's levels")


def summary(closed: dict, open_run: dict) -> dict:
    def row(level: dict) -> dict:
        return {
            "level": level["level"],
            "audio_s_per_s": round(level["audio_s_per_s"], 1),
            "ttfa_p50_ms": round(1000 * level["ttfa"]["p50"], 1) if level["ttfa"].get("n") else None,
            "ttfa_p95_ms": round(1000 * level["ttfa"]["p95"], 1) if level["ttfa"].get("n") else None,
            "underrun_pct": round(level["underrun_pct"], 1),
            "failures": level["failures"],
        }

    return {
        "closed": [row(lv) for lv in closed["levels"]],
        "open": [dict(row(lv), capacity_pass=lv.get("capacity_pass")) for lv in open_run["levels"]],
        "capacity_rps": open_run.get("capacity_rps"),
        "capacity_audio_s_per_s": capacity_throughput(open_run),
    }


def ratio(one: dict, many: dict) -> Optional[float]:
    a, b = one["capacity_audio_s_per_s"], many["capacity_audio_s_per_s"]
    return None if not a or b is None else round(b / a, 2)


def ratio_at_most(one: dict, many: dict) -> Optional[float]:
    """An upper bound of the ratio when the many-GPU server passed no rate but the one-GPU server
    did: the many-GPU server's audio-s/s at its lowest offered rate over the one-GPU server's at
    its capacity. None otherwise."""
    a = one["capacity_audio_s_per_s"]
    if not a or many["capacity_audio_s_per_s"] is not None or not many["open"]:
        return None
    lowest = min(many["open"], key=lambda r: r["level"])
    return round(lowest["audio_s_per_s"] / a, 2)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one", nargs=2, metavar=("CLOSED", "OPEN"), required=True)
    p.add_argument("--many", nargs=2, metavar=("CLOSED", "OPEN"), required=True)
    p.add_argument("--gpus", type=int, default=2, help="GPU count of the --many server (default 2)")
    p.add_argument("--out-json")
    args = p.parse_args(argv)
    one = summary(*map(_load, args.one))
    many = summary(*map(_load, args.many))
    key = f"scaling_{args.gpus}gpu_ratio"
    result = {"gpus": {"1": one, str(args.gpus): many}, key: ratio(one, many)}
    bound = ratio_at_most(one, many)
    if bound is not None:
        result[f"{key}_at_most"] = bound
    print("| GPUs | loop | level | audio-s/s | TTFA p50 / p95 ms | underrun | failed | capacity |")
    print("|---:|---|---:|---:|---|---:|---:|---|")
    for gpus, s in (("1", one), (str(args.gpus), many)):
        for kind in ("closed", "open"):
            for r in s[kind]:
                verdict = {True: "pass", False: "fail", None: ""}[r.get("capacity_pass")]
                unit = "streams" if kind == "closed" else "req/s"
                print(
                    f"| {gpus} | {kind} | {r['level']:g} {unit} | {r['audio_s_per_s']} | "
                    f"{r['ttfa_p50_ms']} / {r['ttfa_p95_ms']} | {r['underrun_pct']} % | {r['failures']} | {verdict} |"
                )
    for gpus, s in (("1", one), (str(args.gpus), many)):
        print(f"{gpus} GPU(s): capacity {s['capacity_rps']} req/s, {s['capacity_audio_s_per_s']} audio-s/s there")
    print(f"{key}: {result[key]}")
    if bound is not None:
        print(f"{key}: at most {bound} ({args.gpus} GPUs passed none of the rates tried)")
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
