#!/usr/bin/env python3
"""Print the stub profiles written with QWEN3_TTS_PROFILE_DIR (triton_qwen3_tts/serving/profiling.py).

    python scripts/profile_report.py DIR [--stacks 3]

Per process: wall and CPU seconds (CPU/wall near 1.0 = one core busy, the GIL's limit); per
thread (same-named pool threads summed): CPU seconds, share of wall, and its commonest stacks
(innermost frame first, share of that thread's samples); the named timings.
"""

import argparse
import glob
import json
import os
import sys


def render(report, stacks: int) -> str:
    wall = report["wall_s"] or 1e-9
    lines = [
        f"== {report['name']} (pid {report['pid']}): wall {wall:.1f} s, process CPU "
        f"{report['process_cpu_s']:.1f} s = {report['process_cpu_s'] / wall:.2f} cores"
    ]
    threads = sorted(report["threads"].items(), key=lambda kv: -(kv[1].get("cpu_s") or 0))
    for name, t in threads:
        cpu = t.get("cpu_s")
        cpu_s = "-" if cpu is None else f"{cpu:7.2f} s {cpu / wall:5.0%}"
        lines.append(f"  {name:<28} x{t.get('threads', 0):<3} CPU {cpu_s}  samples {t.get('samples', 0)}")
        n = t.get("samples") or 0
        for stack, c in (t.get("top") or [])[:stacks]:
            lines.append(f"      {c / n if n else 0:5.0%}  {stack}")
    for key, s in sorted(report.get("timings", {}).items()):
        if s["count"]:
            lines.append(
                f"  timing {key}: n={s['count']} mean {s['mean_s'] * 1e3:.2f} ms, p50 "
                f"{s['p50_s'] * 1e3:.2f}, p95 {s['p95_s'] * 1e3:.2f}, p99 {s['p99_s'] * 1e3:.2f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--stacks", type=int, default=3, help="stacks shown per thread")
    a = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(a.dir, "*.json")))
    if not files:
        print(f"no profiles (*.json) in {a.dir}", file=sys.stderr)
        return 1
    for f in files:
        with open(f, encoding="utf-8") as fh:
            print(render(json.load(fh), a.stacks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
