#!/usr/bin/env python3
"""CPU time of a process tree between two moments: which process of a server (tritonserver, its
Python-backend stubs, the tts's engine workers) is busy under load. Linux only (/proc).

    python scripts/proc_cpu.py snap --root PID --out before.json    # PID and all its descendants
    ... load ...
    python scripts/proc_cpu.py snap --root PID --out after.json
    python scripts/proc_cpu.py diff before.json after.json [--out-json cpu.json]

``diff`` prints, per process alive at both moments, its CPU use over the interval in percent of
one core (user + system, from /proc/PID/stat), its name (/proc/PID/comm: the engine workers name
themselves qwen3tts-gpuN) and the start of its command line. A process near 100 % is bound to one
core; a Python process there is bound by its interpreter lock.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without the package installed
from triton_qwen3_tts.serving.stub_procs import cmdline, pids, proc_stat  # noqa: E402


def tree(root: int, parent: Dict[int, int]) -> List[int]:
    """``root`` and every descendant of it in ``parent`` (pid -> parent pid)."""
    found, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in found:
                found.add(child)
                frontier.append(child)
    return sorted(pid for pid in found if pid in parent)


def snap(root: int) -> dict:
    """CPU seconds, name and command line of ``root`` and every descendant alive now."""
    stats = {pid: st for pid in pids() if (st := proc_stat(pid)) is not None}
    procs = {}
    for pid in tree(root, {p: st.ppid for p, st in stats.items()}):
        if stats[pid].cpu_s is not None:
            procs[str(pid)] = {"comm": stats[pid].comm, "cmd": cmdline(pid)[:160], "cpu_s": stats[pid].cpu_s}
    return {"time": time.time(), "root": root, "procs": procs}


def diff(a: dict, b: dict) -> List[dict]:
    wall = b["time"] - a["time"]
    rows = []
    for pid, p in b["procs"].items():
        if pid in a["procs"]:
            used = p["cpu_s"] - a["procs"][pid]["cpu_s"]
            rows.append(
                {"pid": int(pid), "comm": p["comm"], "cmd": p["cmd"], "cpu_s": used, "cpu_pct": 100 * used / wall}
            )
    rows.sort(key=lambda r: -r["cpu_s"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snap", help="CPU seconds of PID's process tree now")
    s.add_argument("--root", type=int, required=True)
    s.add_argument("--out", required=True)
    d = sub.add_parser("diff", help="CPU use per process between two snaps")
    d.add_argument("before")
    d.add_argument("after")
    d.add_argument("--out-json")
    a = ap.parse_args(argv)
    if a.cmd == "snap":
        with open(a.out, "w") as f:
            json.dump(snap(a.root), f)
        return 0
    with open(a.before) as f:
        before = json.load(f)
    with open(a.after) as f:
        after = json.load(f)
    rows = diff(before, after)
    wall = after["time"] - before["time"]
    print(f"CPU per process over {wall:.1f} s (percent of one core)")
    for r in rows:
        if r["cpu_s"] > 0:
            print(f"{r['cpu_pct']:7.1f} %  {r['pid']:>7}  {r['comm']:<16} {r['cmd'][:90]}")
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump({"wall_s": wall, "procs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
