"""scripts/scaling_report.py: the capacity point's throughput and the 2-GPU ratio, on synthetic
runs and on recorded outputs: run 25b's ratio, run 26e's upper bound, and run 30d's ratio, which
is the ``scaling_2gpu_ratio`` figure in docs/bench/goals.json."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import scaling_report  # noqa: E402


def _level(rate, audio, passed):
    return {
        "level": rate,
        "audio_s_per_s": audio,
        "ttfa": {"n": 1, "p50": 0.05, "p95": 0.08},
        "underrun_pct": 0.0,
        "failures": 0,
        "capacity_pass": passed,
    }


def test_capacity_throughput_is_the_served_rate_at_the_capacity_level():
    run = {
        "capacity_rps": 20.0,
        "levels": [_level(10.0, 40.0, True), _level(20.0, 79.0, True), _level(30.0, 95.0, False)],
    }
    assert scaling_report.capacity_throughput(run) == 79.0
    assert scaling_report.capacity_throughput({"capacity_rps": None, "levels": []}) is None
    with pytest.raises(ValueError, match="not one of the run's levels"):
        scaling_report.capacity_throughput({"capacity_rps": 5.0, "levels": [_level(10.0, 40.0, True)]})


def test_ratio_is_empty_without_a_capacity_point():
    assert scaling_report.ratio({"capacity_audio_s_per_s": 40.0}, {"capacity_audio_s_per_s": 78.0}) == 1.95
    assert scaling_report.ratio({"capacity_audio_s_per_s": None}, {"capacity_audio_s_per_s": 78.0}) is None
    assert scaling_report.ratio({"capacity_audio_s_per_s": 40.0}, {"capacity_audio_s_per_s": None}) is None


def _report(d, tmp_path) -> dict:
    """scripts/scaling_report.py over a scaling run's recorded outputs in ``d``; its JSON."""
    out = tmp_path / "scaling.json"
    scaling_report.main(
        ["--one", str(d / "closed_a.json.gz"), str(d / "open_a.json.gz")]
        + ["--many", str(d / "closed_b.json.gz"), str(d / "open_b.json.gz"), "--gpus", "2", "--out-json", str(out)]
    )
    return json.loads(out.read_text())


def test_run25_recorded_outputs_give_the_goal_figure(tmp_path, capsys):
    d = ROOT / "docs" / "bench" / "run25_gpus2" / "b"
    result = _report(d, tmp_path)
    assert result == json.loads((d / "scaling.json").read_text())
    assert "scaling_2gpu_ratio: 1.56" in capsys.readouterr().out


def test_run26e_recorded_outputs_give_only_an_upper_bound(tmp_path, capsys):
    # two GPUs passed none of the rates tried: no ratio, only its upper bound
    result = _report(ROOT / "docs" / "bench" / "run26_gpus2" / "e", tmp_path)
    assert result["scaling_2gpu_ratio"] is None
    assert result["scaling_2gpu_ratio_at_most"] == 1.43
    assert result["gpus"]["1"]["capacity_rps"] == 22 and result["gpus"]["2"]["capacity_rps"] is None
    assert "scaling_2gpu_ratio: at most 1.43" in capsys.readouterr().out


def test_run30d_recorded_outputs_give_the_goal_figure(tmp_path, capsys):
    d = ROOT / "docs" / "bench" / "run30" / "d"
    result = _report(d, tmp_path)
    goals = {f["id"]: f["value"] for f in json.loads((ROOT / "docs" / "bench" / "goals.json").read_text())["figures"]}
    assert result == json.loads((d / "scaling.json").read_text())
    assert result["scaling_2gpu_ratio"] == goals["scaling_2gpu_ratio"] == 2.04
    assert result["gpus"]["1"]["capacity_rps"] == 24 and result["gpus"]["2"]["capacity_rps"] == 48
    assert "scaling_2gpu_ratio: 2.04" in capsys.readouterr().out


def test_the_bound_needs_a_one_gpu_capacity_and_a_failing_many_gpu_server():
    one = {"capacity_audio_s_per_s": 80.0}
    many = {
        "capacity_audio_s_per_s": None,
        "open": [{"level": 40, "audio_s_per_s": 150.0}, {"level": 30, "audio_s_per_s": 120.0}],
    }
    assert scaling_report.ratio_at_most(one, many) == 1.5  # the lowest rate's 120 over 80
    assert scaling_report.ratio_at_most({"capacity_audio_s_per_s": None}, many) is None
    assert scaling_report.ratio_at_most(one, dict(many, capacity_audio_s_per_s=160.0)) is None
