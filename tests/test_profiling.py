"""The stub profiler (triton_qwen3_tts/serving/profiling.py) and its report script: pure Python, no Triton."""

import json
import subprocess
import sys
import threading
from pathlib import Path

from triton_qwen3_tts.serving import profiling

ROOT = Path(__file__).resolve().parents[1]


def _spin_here(stop):
    x = 0
    while not stop.is_set():
        x += 1
    return x


def test_sampler_attributes_a_busy_thread_and_its_cpu(tmp_path):
    s = profiling.StackSampler("unit", str(tmp_path), interval=0.001, flush_every=60)
    stop = threading.Event()
    worker = threading.Thread(target=_spin_here, args=(stop,), name="busy-worker")
    s._t0, s._cpu0 = 0.0, 0.0
    worker.start()
    try:
        for _ in range(50):  # sample synchronously: no timing in the assertion
            s.sample_once()
        s.timing("codec_call", 0.002)
        s.timing("codec_call", 0.004)
        rep = s.report()  # while the worker is alive, so its CPU clock can be read
    finally:
        stop.set()
        worker.join()
    t = rep["threads"]["busy-worker"]
    assert t["samples"] == 50
    assert any("_spin_here" in stack for stack, _ in t["top"]), t["top"]
    assert t["cpu_s"] > 0
    tim = rep["timings"]["codec_call"]
    assert tim["count"] == 2 and abs(tim["mean_s"] - 0.003) < 1e-12


def test_maybe_start_is_off_without_the_env_and_writes_when_on(tmp_path, monkeypatch):
    monkeypatch.delenv(profiling.ENV_DIR, raising=False)
    assert profiling.maybe_start("off") is None
    profiling.timing("x", 1.0)  # no sampler: a no-op, not an error
    monkeypatch.setenv(profiling.ENV_DIR, str(tmp_path / "prof"))
    monkeypatch.setenv(profiling.ENV_INTERVAL, "2")
    s = profiling.maybe_start("tts")
    try:
        assert s is not None and profiling.maybe_start("again") is s  # once per process
        profiling.timing("first_frames", 0.01)
    finally:
        profiling.stop()
    data = json.loads(Path(s.path).read_text())
    assert data["name"] == "tts" and data["timings"]["first_frames"]["count"] == 1
    assert "MainThread" in data["threads"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_report.py"), str(tmp_path / "prof")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "== tts" in out and "timing first_frames: n=1" in out


def test_report_script_says_when_there_is_nothing(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_report.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "no profiles" in r.stderr


def test_snapshot_reads_other_threads_without_walking_their_frames():
    """The sampler's stacks come from faulthandler's C-level dump (no f_back walk from Python,
    which crashed a stub when another thread returned meanwhile), parsed per thread ident."""
    import threading

    from triton_qwen3_tts.serving.profiling import _parse_dump, _Snapshot

    go, done = threading.Event(), threading.Event()

    def parked_in_a_named_function():
        go.set()
        done.wait(10)

    t = threading.Thread(target=parked_in_a_named_function)
    t.start()
    go.wait(5)
    try:
        stacks = _Snapshot().take()
    finally:
        done.set()
        t.join()
    assert t.ident in stacks
    assert any(":parked_in_a_named_function:" in label for label in stacks[t.ident])
    assert _parse_dump('Thread 0x000000000000000a (most recent call first):\n  File "/a/b/c.py", line 3 in f\n') == {
        10: ["b/c.py:f:3"]
    }
