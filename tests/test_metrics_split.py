"""scripts/metrics_split.py: per-level figures from cumulative Triton metric snapshots."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import metrics_split  # noqa: E402


def snapshot(ttfa_sum, ttfa_n, ttff_sum, codec_n, codec_exec, codec_us, queue_us):
    return "\n".join(
        [
            f'qwen3_tts_time_to_first_audio_seconds_sum{{model="tts",instance="tts_0"}} {ttfa_sum}',
            f'qwen3_tts_time_to_first_audio_seconds_count{{model="tts",instance="tts_0"}} {ttfa_n}',
            f'qwen3_tts_time_to_first_frames_seconds_sum{{model="tts",instance="tts_0"}} {ttff_sum}',
            f'qwen3_tts_time_to_first_frames_seconds_count{{model="tts",instance="tts_0"}} {ttfa_n}',
            f'nv_inference_count{{model="codec_decoder_stateful",version="1"}} {codec_n}',
            f'nv_inference_exec_count{{model="codec_decoder_stateful",version="1"}} {codec_exec}',
            f'nv_inference_compute_infer_duration_us{{model="codec_decoder_stateful",version="1"}} {codec_us}',
            f'nv_inference_queue_duration_us{{model="codec_decoder_stateful",version="1"}} {queue_us}',
            "# a comment line",
            "",
        ]
    )


def test_level_figures_are_differences_of_snapshots():
    a = metrics_split.parse(snapshot(0.4, 10, 0.25, 120, 120, 1_200_000, 120_000))
    b = metrics_split.parse(
        snapshot(0.4 + 4.0, 30, 0.25 + 3.0, 120 + 400, 120 + 100, 1_200_000 + 8_000_000, 120_000 + 4_000_000)
    )
    f1 = metrics_split.level_figures(a, {})
    assert f1["first_audio_ms"] == pytest.approx(40.0) and f1["first_frames_ms"] == pytest.approx(25.0)
    assert f1["codec_decoder_stateful.exec_ms"] == pytest.approx(10.0)
    f2 = metrics_split.level_figures(b, a)
    assert f2["requests"] == 20 and f2["first_audio_ms"] == pytest.approx(200.0)
    assert f2["codec_decoder_stateful.batch"] == pytest.approx(4.0)
    # compute is counted per request: 8 s over 400 requests = 20 ms per execution of 4 requests
    assert f2["codec_decoder_stateful.exec_ms"] == pytest.approx(20.0)
    assert f2["codec_decoder_stateful.busy_s"] == pytest.approx(2.0)
    assert f2["codec_decoder_stateful.queue_ms"] == pytest.approx(10.0)
    assert "talker.requests" not in f2


def test_cli(tmp_path):
    p1, p2 = tmp_path / "metrics_x_c1.txt", tmp_path / "metrics_x_c32.txt"
    p1.write_text(snapshot(0.4, 10, 0.25, 120, 120, 1_200_000, 120_000))
    p2.write_text(snapshot(4.4, 30, 3.25, 520, 220, 9_200_000, 4_120_000))
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "metrics_split.py"), str(p1), str(p2)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "level 1: 10 requests" in r.stdout and "level 32: 20 requests" in r.stdout
    assert "TTFA 200.0 ms = first frames 150.0 + 50.0" in r.stdout
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing here\n")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "metrics_split.py"), str(empty)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "no Prometheus samples" in r.stderr


def fused(step_s, codec_s, prefill_s, gaps):
    lab = 'gpu="0",model="tts"'
    lines = [
        f'qwen3_tts_fused_device_seconds_total{{{lab},kind="step_b64"}} {step_s * 0.9}',
        f'qwen3_tts_fused_device_seconds_total{{{lab},kind="step_b8"}} {step_s * 0.1}',
        f'qwen3_tts_fused_device_seconds_total{{{lab},kind="codec_done"}} {codec_s}',
        f'qwen3_tts_fused_device_seconds_total{{{lab},kind="prefill"}} {prefill_s}',
    ]
    lines += [f'qwen3_tts_fused_device_gap_seconds_total{{{lab},transition="{t}"}} {v}' for t, v in gaps.items()]
    return "\n".join(lines)


def test_device_figures_split_the_window_and_leave_idle_out():
    a = metrics_split.parse(fused(10.0, 3.0, 1.0, {"step>prefill": 0.1, "idle": 50.0}))
    b = metrics_split.parse(fused(14.0, 5.0, 1.5, {"step>prefill": 0.3, "codec>codec": 0.1, "idle": 51.0}))
    f = metrics_split.device_figures(b, a)
    assert f["device.step_s"] == pytest.approx(4.0) and f["device.codec_s"] == pytest.approx(2.0)
    assert f["device.prefill_s"] == pytest.approx(0.5)
    assert f["gap.step>prefill_s"] == pytest.approx(0.2) and f["gap.idle_s"] == pytest.approx(1.0)
    # 6.5 s of work and 0.3 s of gaps under 50 ms; the idle second does not count
    assert f["busy_working"] == pytest.approx(6.5 / 6.8)
    assert metrics_split.device_figures(metrics_split.parse(snapshot(0.4, 10, 0.25, 1, 1, 1, 1)), {}) == {}


def test_cli_pairs(tmp_path):
    paths = []
    for i, text in enumerate(
        [
            fused(10.0, 3.0, 1.0, {"step>prefill": 0.1}),
            fused(14.0, 5.0, 1.5, {"step>prefill": 0.3}),
            fused(20.0, 6.0, 2.0, {"step>prefill": 0.3}),
            fused(21.0, 6.5, 2.5, {"step>prefill": 0.4}),
        ]
    ):
        paths.append(tmp_path / f"m{i}.txt")
        paths[-1].write_text(text)
    script = os.path.join(ROOT, "scripts", "metrics_split.py")
    r = subprocess.run([sys.executable, script, "--pairs", *map(str, paths)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # two windows: (m0, m1) and (m2, m3), not m2 against m1
    assert "GPU: 6.50 s (codec 2.00, prefill 0.50, step 4.00)" in r.stdout
    assert "GPU: 2.00 s (codec 0.50, prefill 0.50, step 1.00); gaps under 50 ms 0.100 s" in r.stdout
    assert r.stdout.count("GPU:") == 2 and "GPU: 7.50 s" not in r.stdout  # m2 against m1 would read 7.50
    r = subprocess.run([sys.executable, script, "--pairs", *map(str, paths[:3])], capture_output=True, text=True)
    assert r.returncode == 2 and "even number" in r.stderr
