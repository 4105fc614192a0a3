"""scripts/proc_cpu.py: the CPU time of a process tree, per process, between two snapshots (the
scaling bench's way to see which server process is busy under load)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import proc_cpu  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")

# burns 0.5 s of its own CPU, says so, then waits (no more CPU) until its stdin closes
BURN = "import sys, time\nwhile time.process_time() < 0.5: pass\nprint('burnt', flush=True)\nsys.stdin.read()\n"


def test_a_busy_descendant_is_charged_its_cpu_time(tmp_path):
    before = proc_cpu.snap(os.getpid())
    # a grandchild: the tree is followed below direct children
    child = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURN!r}])"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "burnt"
        mid = proc_cpu.snap(os.getpid())
        after = proc_cpu.snap(os.getpid())
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    pids = [int(p) for p in mid["procs"]]
    assert os.getpid() in pids and child.pid in pids and len(pids) >= 3
    # the grandchild appeared after `before`, so diff(before, mid) leaves it out; between mid and
    # after it waits: charged (almost) nothing
    assert all(r["pid"] in map(int, before["procs"]) for r in proc_cpu.diff(before, mid))
    grandchild = [p for p, v in mid["procs"].items() if " -c import sys, time" in v["cmd"]]
    assert len(grandchild) == 1 and mid["procs"][grandchild[0]]["cpu_s"] >= 0.45
    rows = {r["pid"]: r for r in proc_cpu.diff(mid, after)}
    assert rows[int(grandchild[0])]["cpu_s"] < 0.2


def test_the_command_line_writes_and_diffs_snapshots(tmp_path):
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "cpu.json"
    script = Path(proc_cpu.__file__)
    for f in (a, b):
        subprocess.run([sys.executable, script, "snap", "--root", str(os.getpid()), "--out", f], check=True)
    res = subprocess.run(
        [sys.executable, script, "diff", a, b, "--out-json", out], check=True, capture_output=True, text=True
    )
    assert res.stdout.startswith("CPU per process over")
    data = json.loads(out.read_text())
    assert data["wall_s"] > 0 and os.getpid() in [r["pid"] for r in data["procs"]]
