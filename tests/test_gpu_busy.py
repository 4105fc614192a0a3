"""scripts/gpu_busy.py: the GPU's busy share between the fused pipeline's stats lines."""

import gzip
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_busy  # noqa: E402


def _line(clock, gpu, steps, step_ms, codec_ms, prefill_ms, prefills, loop=None, gaps=None):
    stats = {
        "active": 3,
        "steps": steps,
        "gpu_ms": {
            "step_b32": {"ms": step_ms, "calls": steps, "mean_ms": 5.0},
            "codec_first": {"ms": codec_ms, "calls": 7, "mean_ms": 2.0},
            "prefill": {"ms": prefill_ms, "calls": prefills, "mean_ms": 3.7},
        },
    }
    if loop is not None:
        stats["loop_ms"] = {k: {"ms": v, "calls": steps} for k, v in loop.items()}
    if gaps is not None:
        stats["gpu_gap_ms"] = {k: {"ms": v, "calls": steps} for k, v in gaps.items()}
    # as tritonserver writes it: the message quoted, the JSON's quotes escaped
    text = json.dumps(stats).replace('"', '\\"')
    return f'I1128 {clock} 631 triton.py:411] "tts fused pipeline gpu {gpu}: {text}"\n'


LOG = [
    "I1128 04:17:00.000000 1 server.cc:1] started\n",
    _line("04:17:16.000000", 0, 1000, 5000.0, 2000.0, 1000.0, 100),
    _line("04:17:16.500000", 1, 50, 10.0, 0.0, 0.0, 1),  # another GPU's line
    _line("04:17:46.000000", 0, 4000, 20000.0, 8000.0, 4000.0, 1000),
    _line("04:18:16.000000", 0, 4000, 20000.0, 8000.0, 4000.0, 1000),  # idle interval
]


def test_intervals_are_differences_of_consecutive_lines():
    stats = gpu_busy.parse(LOG, gpu=0)
    assert [s.steps for s in stats] == [1000, 4000, 4000]
    busy, idle = gpu_busy.intervals(stats)
    assert busy["seconds"] == pytest.approx(30.0)
    # (15 + 6 + 3) s of device time in 30 s
    assert busy["busy_pct"] == pytest.approx(80.0)
    assert busy["iterations"] == 3000 and busy["ms_per_iter"] == pytest.approx(10.0)
    assert busy["gpu_ms_per_iter"] == pytest.approx({"codec": 2.0, "prefill": 1.0, "step": 5.0})
    assert busy["prefills"] == 900
    assert idle["busy_pct"] == 0.0 and idle["iterations"] == 0 and idle["gpu_ms_per_iter"] == {}


def test_other_gpus_lines_are_their_own():
    only = gpu_busy.parse(LOG, gpu=1)
    assert len(only) == 1 and only[0].steps == 50


def test_command_reads_a_gzipped_log_and_refuses_one_line(tmp_path):
    log = tmp_path / "server.log.gz"
    with gzip.open(log, "wt") as f:
        f.writelines(LOG)
    script = os.path.join(ROOT, "scripts", "gpu_busy.py")
    out = subprocess.run([sys.executable, script, str(log)], capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in out.splitlines()[1:] if ln.strip()]
    assert len(rows) == 2 and "80%" in rows[0] and "step 5.00" in rows[0]
    one = tmp_path / "one.log"
    one.write_text("".join(LOG[:2]))
    r = subprocess.run([sys.executable, script, str(one)], capture_output=True, text=True)
    assert r.returncode == 1 and "need two" in r.stderr


def _script_output(tmp_path, log) -> str:
    """scripts/gpu_busy.py's standard output on a log of these lines."""
    path = tmp_path / "server.log"
    path.write_text("".join(log))
    script = os.path.join(ROOT, "scripts", "gpu_busy.py")
    return subprocess.run([sys.executable, script, str(path)], capture_output=True, text=True).stdout


def test_loop_phases_per_iteration_and_waits_apart(tmp_path):
    log = [
        _line("04:17:16.000000", 0, 1000, 5000.0, 0.0, 0.0, 0, loop={"read": 500.0, "wait_step": 400.0}),
        _line(
            "04:17:46.000000", 0, 3000, 15000.0, 0.0, 0.0, 0, loop={"read": 2500.0, "wait_step": 1400.0, "post": 600.0}
        ),
    ]
    (row,) = gpu_busy.intervals(gpu_busy.parse(log, gpu=0))
    # a phase first seen in the later line counts from zero
    assert row["loop_ms_per_iter"] == pytest.approx({"post": 0.3, "read": 1.0, "wait_step": 0.5})
    out = _script_output(tmp_path, log)
    assert "loop ms/iter: post 0.30 read 1.00; waits wait_step 0.50" in out
    # logs from before loop_ms: no second line
    (old,) = gpu_busy.intervals(gpu_busy.parse(LOG[1:4:2], gpu=0))
    assert old["loop_ms_per_iter"] == {}


def test_gpu_gaps_per_iteration(tmp_path):
    log = [
        _line("04:17:16.000000", 0, 1000, 5000.0, 0.0, 0.0, 0, loop={"release": 1.0}, gaps={"step>step": 100.0}),
        _line(
            "04:17:46.000000",
            0,
            3000,
            15000.0,
            0.0,
            0.0,
            0,
            loop={"release": 2.0},
            gaps={"step>step": 300.0, "codec>step": 400.0},
        ),
    ]
    (row,) = gpu_busy.intervals(gpu_busy.parse(log, gpu=0))
    # per loop iteration (release laps; here 2000 more), a transition first seen later from zero
    assert row["gap_ms_per_iter"] == pytest.approx({"codec>step": 0.2, "step>step": 0.1})
    out = _script_output(tmp_path, log)
    assert "gpu gaps ms/iter: codec>step 0.20 step>step 0.10" in out
    (old,) = gpu_busy.intervals(gpu_busy.parse(LOG[1:4:2], gpu=0))
    assert old["gap_ms_per_iter"] == {}
