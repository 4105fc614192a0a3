"""Metric arithmetic of the service benchmark on hand-computed synthetic timings, plus the
benchmark loop itself against an in-process fake client (no server, no tritonclient)."""

import importlib.util
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from triton_qwen3_tts.tools import bench_metrics as bm
from triton_qwen3_tts.tools.client import Synthesis

ROOT = Path(__file__).resolve().parents[1]
SR = 24000


def test_module_does_not_import_tritonclient():
    code = (
        "import sys; import triton_qwen3_tts.tools.bench_metrics; "
        "assert not any(m.startswith('tritonclient') for m in sys.modules), 'tritonclient imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_audio_seconds_and_first_audio():
    chunks = [(0.05, 0), (0.10, 4800), (0.25, 9600)]
    assert bm.audio_seconds(chunks, SR) == pytest.approx(14400 / 24000)
    assert bm.first_audio(chunks) == pytest.approx(0.10)  # the empty chunk does not count
    assert bm.first_audio([(0.1, 0)]) is None


def test_underruns_hand_computed():
    # 0.10: 0.2 s queued -> plays until 0.30
    # 0.25: arrives before 0.30 -> +0.4 s -> 0.70
    # 0.80: after 0.70 -> underrun, gap 0.10; plays 0.1 s -> 0.90
    # 0.90: exactly at the end -> no underrun; -> 1.00
    # 1.50: empty -> ignored
    # 1.20: after 1.00 -> underrun, gap 0.20 (chunks are taken in arrival order)
    chunks = [(0.10, 4800), (0.25, 9600), (0.80, 2400), (0.90, 2400), (1.50, 0), (1.20, 24000)]
    n, gap = bm.underruns(chunks, SR)
    assert n == 2
    assert gap == pytest.approx(0.30)


def test_underruns_none_when_faster_than_real_time():
    chunks = [(0.1 * i, 4800) for i in range(1, 20)]  # 0.2 s of audio every 0.1 s
    assert bm.underruns(chunks, SR) == (0, 0.0)
    assert bm.underruns([], SR) == (0, 0.0)
    assert bm.underruns([(0.3, 2400)], SR) == (0, 0.0)


def test_underruns_slow_stream():
    # 0.1 s of audio every 0.5 s: every later chunk is an underrun of 0.4 s
    chunks = [(0.5 * i, 2400) for i in range(1, 5)]
    n, gap = bm.underruns(chunks, SR)
    assert n == 3
    assert gap == pytest.approx(1.2)


def test_percentile_is_numpy_linear():
    vals = list(range(1, 11))  # 1..10
    # rank (n-1)*q/100: p50 -> 4.5 -> 5.5; p95 -> 8.55 -> 9.55; p99 -> 8.91 -> 9.91
    assert bm.percentile(vals, 50) == pytest.approx(5.5)
    assert bm.percentile(vals, 95) == pytest.approx(9.55)
    assert bm.percentile(vals, 99) == pytest.approx(9.91)
    assert bm.percentile([7.0], 95) == 7.0
    assert bm.percentile([], 50) is None
    s = bm.summarize([3.0, None, 1.0, 2.0])
    assert s == {
        "n": 3,
        "mean": pytest.approx(2.0),
        "p50": pytest.approx(2.0),
        "p95": pytest.approx(2.9),
        "p99": pytest.approx(2.98),
    }
    assert bm.summarize([]) == {"n": 0, "mean": None, "p50": None, "p95": None, "p99": None}


def test_request_metrics():
    r = bm.RequestRecord(
        t_send=0.0, ok=True, latency=3.0, ttfa=None, chunks=[(0.2, 24000), (1.5, 24000)], sample_rate=SR
    )
    m = bm.request_metrics(r)
    assert m["ttfa"] == pytest.approx(0.2)  # taken from the chunks when not given
    assert m["audio_s"] == pytest.approx(2.0)
    assert m["rtf"] == pytest.approx(1.5)
    # plays 0.2..1.2; the second chunk at 1.5 -> underrun of 0.3 s
    assert m["underruns"] == 1 and m["underrun_s"] == pytest.approx(0.3)
    silent = bm.request_metrics(bm.RequestRecord(t_send=0.0, ok=True, latency=1.0, chunks=[]))
    assert silent["rtf"] is None and silent["ttfa"] is None and silent["audio_s"] == 0.0


def _level_records():
    r1 = bm.RequestRecord(t_send=0.0, ok=True, latency=2.0, ttfa=0.1, chunks=[(0.1, 24000), (1.0, 24000)])
    r2 = bm.RequestRecord(t_send=0.5, ok=True, latency=1.5, ttfa=0.3, chunks=[(0.3, 12000), (1.0, 12000)])
    r3 = bm.RequestRecord(t_send=1.0, ok=False, latency=0.01, error="[UNAVAILABLE] full", error_code="UNAVAILABLE")
    return [r1, r2, r3]


def test_aggregate_hand_computed():
    recs = _level_records()
    assert bm.wall_seconds(recs) == pytest.approx(2.0)  # first send 0 -> last end max(2.0, 2.0, 1.01)
    agg = bm.aggregate(recs, level=4, mode="closed")
    assert agg["requests"] == 3 and agg["ok"] == 2 and agg["failures"] == 1
    assert agg["failure_codes"] == {"UNAVAILABLE": 1}
    assert agg["wall_s"] == pytest.approx(2.0)
    assert agg["req_per_s"] == pytest.approx(1.0)  # 2 ok / 2 s
    assert agg["audio_s"] == pytest.approx(3.0)  # 2 s + 1 s
    assert agg["audio_s_per_s"] == pytest.approx(1.5)
    # TTFA 0.1, 0.3: mean 0.2, p50 0.2, p95 0.1 + 0.95*0.2 = 0.29, p99 0.298
    assert agg["ttfa"]["mean"] == pytest.approx(0.2)
    assert agg["ttfa"]["p50"] == pytest.approx(0.2)
    assert agg["ttfa"]["p95"] == pytest.approx(0.29)
    assert agg["ttfa"]["p99"] == pytest.approx(0.298)
    # RTF 2.0/2.0 = 1.0 and 1.5/1.0 = 1.5
    assert agg["rtf"]["p50"] == pytest.approx(1.25)
    assert agg["latency"]["mean"] == pytest.approx(1.75)
    # r1: plays 0.1..1.1, chunk at 1.0 in time; r2: plays 0.3..0.8, chunk at 1.0 -> gap 0.2
    assert agg["underruns_total"] == 1 and agg["requests_with_underrun"] == 1
    assert agg["underrun_gap_s"]["mean"] == pytest.approx(0.1)
    assert agg["underrun_gap_s"]["p50"] == pytest.approx(0.1)
    assert agg["percentile_method"] == "numpy linear"
    json.dumps(agg)  # JSON-able


def test_aggregate_explicit_wall_and_lateness():
    recs = _level_records()
    for r, s in zip(recs, (0.0, 0.4, 0.9)):
        r.scheduled = s
    agg = bm.aggregate(recs, wall=4.0)
    assert agg["req_per_s"] == pytest.approx(0.5)
    assert agg["audio_s_per_s"] == pytest.approx(0.75)
    assert agg["send_lateness_s"]["mean"] == pytest.approx(0.2 / 3)


def test_aggregate_all_failed():
    agg = bm.aggregate([bm.RequestRecord(t_send=0.0, ok=False, error_code="INVALID_ARG")], wall=1.0)
    assert agg["ok"] == 0 and agg["req_per_s"] == 0.0 and agg["ttfa"]["p95"] is None
    assert bm.aggregate([], wall=0.0)["req_per_s"] is None


def test_flat_rows():
    agg = bm.aggregate(_level_records(), level=1)
    row = bm.flat_level_row(agg)
    assert row["ttfa_p95"] == pytest.approx(0.29) and row["failure_codes"] == "UNAVAILABLE=1"
    rr = bm.record_row(_level_records()[1])
    assert rr["underruns"] == 1 and "chunks" not in rr


# --- the benchmark loop against a fake client -------------------------------------------------


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_service", ROOT / "benchmark" / "benchmark_service.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeClient:
    """Answers each request with 3 chunks of 0.2 s audio, 10 ms apart; 'UNAVAILABLE' for texts
    that contain 'fail'. Records what was sent."""

    sent = []
    lock = threading.Lock()

    def __init__(self):
        self.pending = {}

    def send(self, inputs, request_id=None):
        rid = f"r{id(self)}_{len(self.pending)}_{time.perf_counter_ns()}"
        with FakeClient.lock:
            FakeClient.sent.append({k: v.tolist() for k, v in inputs.items()})
        self.pending[rid] = inputs
        return rid

    def receive(self, rid, t_send, timeout=300.0):
        from triton_qwen3_tts.tools.client import TtsError

        inputs = self.pending.pop(rid)
        text = inputs["text"][0].decode()
        if "fail" in text:
            raise TtsError("[UNAVAILABLE] admission limit reached")
        chunks = []
        for _ in range(3):
            time.sleep(0.01)
            chunks.append((time.perf_counter() - t_send, 4800))
        audio = np.zeros(14400, np.float32)
        return Synthesis(audio, SR, chunks[0][0], time.perf_counter() - t_send, chunks)

    def close(self, cancel=False):
        pass


def test_closed_loop_with_fake_client(tmp_path):
    bs = _load_benchmark()
    FakeClient.sent = []
    out = tmp_path / "b.json"
    a = bs.parse_args(
        [
            "--concurrency",
            "1",
            "2",
            "--requests-per-level",
            "4",
            "--warmup",
            "1",
            "--fixed-frames",
            "30",
            "--speaker",
            "vivian",
            "--task",
            "customvoice",
            "--texts",
            "en",
            "--out-json",
            str(out),
            "--out-csv",
            str(tmp_path / "b.csv"),
            "--plot",
            str(tmp_path / "b.png"),
            "--no-progress",
            "--request-seed",
            "7",
        ]
    )
    import io

    buf = io.StringIO()
    res = bs.run(a, client_factory=FakeClient, out=buf)
    assert [agg["ok"] for agg in res["levels"]] == [4, 4]
    assert len(FakeClient.sent) == 2 * (4 + 1)  # measured + warm-up
    s = FakeClient.sent[-1]
    assert s["max_frames"] == [30] and s["ignore_eos"] == [True]
    assert s["speaker"] == [b"vivian"] and s["task_type"] == [b"CustomVoice"] and s["language"] == [b"english"]
    assert res["levels"][0]["audio_s"] == pytest.approx(4 * 0.6)
    assert res["levels"][0]["underruns_total"] == 0
    assert len(res["requests"]) == 8
    assert json.loads(out.read_text())["percentile_method"] == "numpy linear"
    assert (tmp_path / "b.csv").read_text().count("\n") == 3
    assert (tmp_path / "b.png").stat().st_size > 1000
    assert "closed loop" in buf.getvalue()


def test_open_loop_with_fake_client_and_dataset(tmp_path):
    bs = _load_benchmark()
    FakeClient.sent = []
    ds = tmp_path / "ds.lst"
    ds.write_text("a\tfirst text\n\n# comment\nb\tplease fail\tignored column\n", encoding="utf-8")
    a = bs.parse_args(
        [
            "--rate",
            "50",
            "--requests-per-level",
            "6",
            "--warmup",
            "0",
            "--dataset",
            str(ds),
            "--language",
            "english",
            "--no-progress",
            "--seed",
            "3",
        ]
    )
    import io

    res = bs.run(a, client_factory=FakeClient, out=io.StringIO())
    lvl = res["levels"][0]
    assert lvl["requests"] == 6 and lvl["ok"] + lvl["failures"] == 6
    if lvl["failures"]:
        assert lvl["failure_codes"] == {"UNAVAILABLE": lvl["failures"]}
    assert "send_lateness_s" in lvl
    assert {tuple(s["language"]) for s in FakeClient.sent} == {(b"english",)}


def test_poisson_arrivals_seeded():
    bs = _load_benchmark()
    a1 = bs.poisson_arrivals(2.0, 5, 200, None)
    assert a1 == bs.poisson_arrivals(2.0, 5, 200, None)
    assert a1[0] == 0.0 and len(a1) == 200 and all(x < y for x, y in zip(a1, a1[1:]))
    mean_gap = (a1[-1] - a1[0]) / 199
    assert 0.35 < mean_gap < 0.65  # 1/rate = 0.5
    d = bs.poisson_arrivals(1.0, 0, None, 10.0)
    assert d and max(d) < 10.0


def test_texts():
    sys.path.insert(0, str(ROOT / "benchmark"))
    try:
        import texts
    finally:
        sys.path.pop(0)
    en, zh = texts.load_texts("en"), texts.load_texts("zh")
    assert len(en) >= 8 and len(zh) >= 8
    assert len({i for i, _, _ in en + zh}) == len(en + zh)
    lens = sorted(len(t) for _, t, _ in en)
    assert lens[0] < 20 and lens[-1] > 200  # varied length


# --- streaming capacity, clip lengths, underrun percentages ------------------------------------


def _cap_agg(rate, p95_ms, ok=100, failures=0, with_underrun=0):
    """A hand-made open-loop level: only the keys the capacity functions read."""
    return {
        "level": rate,
        "ok": ok,
        "failures": failures,
        "ttfa": {"p95": None if p95_ms is None else p95_ms / 1000.0},
        "requests_with_underrun": with_underrun,
    }


def test_capacity_passing_and_failing_mix():
    bs = _load_benchmark()
    # given out of order; 2 req/s fails on TTFA, 8 on underruns (1 of 100 = 1 %, not < 1 %)
    aggs = [_cap_agg(4, 80), _cap_agg(1, 30), _cap_agg(8, 90, with_underrun=1), _cap_agg(2, 120)]
    assert bs.capacity(aggs, 100, 1) == 4.0  # the highest passing rate, whatever fails below it
    assert bs.capacity_contiguous(aggs, 100, 1) == 1.0  # 2 fails: only 1 has every lower rate passing
    assert bs.capacity_misses(aggs[3], 100, 1) == ["TTFA p95 120.0 ms > 100 ms"]
    assert bs.capacity_misses(aggs[2], 100, 1) == ["1.0 % underrun >= 1 %"]
    # the thresholds are flags: looser ones let 2 and 8 pass
    assert bs.capacity(aggs, 150, 2) == 8.0 and bs.capacity_contiguous(aggs, 150, 2) == 8.0
    # the bounds: p95 exactly at the limit passes; 0.99 % underrun passes
    edge = [_cap_agg(5, 100.0, ok=101, with_underrun=1)]
    assert bs.capacity(edge, 100, 1) == 5.0
    line = bs.capacity_line(aggs, 100, 1)
    assert line.startswith("capacity: 4 req/s (the highest offered rate with TTFA p95 <= 100 ms, < 1 % of requests")
    assert "contiguous 1 req/s" in line and "failing: 2 (TTFA p95 120.0 ms > 100 ms); 8 (1.0 % underrun" in line
    res = bs.capacity_result(aggs, 100, 1)
    assert res == {
        "capacity_rps": 4.0,
        "capacity_rps_contiguous": 1.0,
        "capacity_ttfa_p95_ms": 100,
        "capacity_underrun_pct": 1,
    }
    json.dumps(res)


def test_capacity_none_passing():
    bs = _load_benchmark()
    aggs = [_cap_agg(1, 150), _cap_agg(2, 300, with_underrun=50)]
    assert bs.capacity(aggs, 100, 1) is None  # None: no tested rate passed
    assert bs.capacity_contiguous(aggs, 100, 1) is None
    assert bs.capacity([], 100, 1) is None and bs.capacity_contiguous([], 100, 1) is None
    line = bs.capacity_line(aggs, 100, 1)
    assert line.startswith("capacity: none: no tested rate passed (")
    assert "2 (TTFA p95 300.0 ms > 100 ms, 50.0 % underrun >= 1 %)" in line


def test_capacity_level_with_failed_requests_does_not_pass():
    bs = _load_benchmark()
    aggs = [_cap_agg(1, 30), _cap_agg(2, 40, ok=99, failures=1), _cap_agg(4, 50)]
    assert bs.capacity_misses(aggs[1], 100, 1) == ["1 failed"]
    assert bs.capacity(aggs, 100, 1) == 4.0
    assert bs.capacity_contiguous(aggs, 100, 1) == 1.0
    # every request failed: no TTFA, no underrun percentage, not a pass
    all_failed = _cap_agg(8, None, ok=0, failures=5)
    assert bs.capacity_misses(all_failed, 100, 1) == ["5 failed", "no successful request"]
    assert bs.capacity([all_failed], 100, 1) is None
    # a level of successful requests without any audio does not pass either
    assert bs.capacity_misses(_cap_agg(8, None), 100, 1) == ["no audio"]


def test_capacity_contiguous_and_repeated_rates():
    bs = _load_benchmark()
    lowest_fails = [_cap_agg(1, 200), _cap_agg(2, 50), _cap_agg(4, 60)]
    assert bs.capacity(lowest_fails, 100, 1) == 4.0
    assert bs.capacity_contiguous(lowest_fails, 100, 1) is None  # the lowest tested rate failed
    assert "contiguous none (the lowest rate failed)" in bs.capacity_line(lowest_fails, 100, 1)
    all_pass = [_cap_agg(r, 20 * r) for r in (1, 2, 4)]
    assert bs.capacity(all_pass, 100, 1) == bs.capacity_contiguous(all_pass, 100, 1) == 4.0
    assert "failing" not in bs.capacity_line(all_pass, 100, 1)
    # a rate tested twice passes only if both of its levels pass
    twice = [_cap_agg(1, 20), _cap_agg(2, 30), _cap_agg(2, 130), _cap_agg(4, 40)]
    assert bs.capacity(twice, 100, 1) == 4.0 and bs.capacity_contiguous(twice, 100, 1) == 1.0
    assert bs.capacity(twice[:3], 100, 1) == 1.0


def test_capacity_on_real_aggregates():
    bs = _load_benchmark()
    smooth = [(0.05, 24000), (0.5, 24000)]
    gap = [(0.05, 2400), (1.0, 2400)]  # 0.1 s of audio, then 0.85 s of silence: an underrun
    level1 = bm.aggregate(
        [bm.RequestRecord(t_send=0.0, ok=True, latency=1.0, ttfa=0.05, chunks=smooth) for _ in range(4)], level=1.0
    )
    level2 = bm.aggregate(
        [bm.RequestRecord(t_send=0.0, ok=True, latency=1.0, ttfa=0.05, chunks=c) for c in (smooth, gap)], level=2.0
    )
    assert bs.underrun_pct(level2) == pytest.approx(50.0)
    assert bs.capacity([level1, level2], 100, 1) == 1.0
    assert bs.capacity([level1, level2], 100, 60) == 2.0


def test_parse_clip_dist():
    bs = _load_benchmark()
    assert bs.parse_clip_dist("fixed") is None
    assert bs.parse_clip_dist("uniform:40:60") == (40, 60)
    assert bs.parse_clip_dist("uniform:7:7") == (7, 7)
    for bad in ("uniform", "uniform:5", "uniform:9:5", "uniform:0:5", "uniform:a:b", "normal:4:6", "uniform:1:2:3"):
        with pytest.raises(ValueError):
            bs.parse_clip_dist(bad)


def test_uniform_clip_draw_is_seeded_and_within_bounds():
    bs = _load_benchmark()
    texts = [("a", "one", "english"), ("b", "two", "english"), ("c", "three", "english")]

    def draws(seed, n=400, clip=(40, 60)):
        p = bs.TextPicker(texts, seed, None, clip)
        return [p.clip_frames() for _ in range(n)]

    d = draws(3)
    assert d == draws(3)  # seeded
    assert d != draws(4)
    assert all(isinstance(x, int) and 40 <= x <= 60 for x in d)
    assert min(d) == 40 and max(d) == 60  # both ends included
    assert set(draws(0, 20, (7, 7))) == {7}
    assert bs.TextPicker(texts, 3, None).clip_frames() is None  # fixed: no draw
    # the clip draws have an RNG of their own: the same seed picks the same texts either way
    p_fixed, p_uniform = bs.TextPicker(texts, 3, None), bs.TextPicker(texts, 3, None, (40, 60))
    picks_uniform = []
    for _ in range(20):
        picks_uniform.append(p_uniform.pick())
        p_uniform.clip_frames()
    assert [p_fixed.pick() for _ in range(20)] == picks_uniform
    rng1, rng2 = random.Random(1), random.Random(1)
    assert [bs.draw_clip_frames(rng1, (1, 3)) for _ in range(10)] == [
        bs.draw_clip_frames(rng2, (1, 3)) for _ in range(10)
    ]


@pytest.mark.parametrize(
    "value, reason",
    [
        ("uniform:9:5", "needs 1 <= LO <= HI"),
        ("gauss:4:6", "neither 'fixed' nor 'uniform:LO:HI'"),
        ("uniform:x:6", "must be integers"),
        ("uniform:40", "neither 'fixed' nor 'uniform:LO:HI'"),
    ],
)
def test_bad_clip_frames_dist_is_an_argparse_error(value, reason, capsys):
    bs = _load_benchmark()
    with pytest.raises(SystemExit) as e:
        bs.parse_args(["--rate", "1", "--clip-frames-dist", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --clip-frames-dist" in err and reason in err, err


def test_clip_frames_dist_flag_checks(capsys):
    bs = _load_benchmark()
    a = bs.parse_args(["--rate", "1"])
    assert a.clip_frames_dist == "fixed" and a.clip_frames_range is None
    assert a.capacity_ttfa_p95_ms == 100.0 and a.capacity_underrun_pct == 1.0
    assert bs.parse_args(["--rate", "1", "--clip-frames-dist", "uniform:40:60"]).clip_frames_range == (40, 60)
    for extra in (["--fixed-frames", "50"], ["--max-frames", "50"]):
        with pytest.raises(SystemExit):
            bs.parse_args(["--rate", "1", "--clip-frames-dist", "uniform:40:60", *extra])
        assert "drop --fixed-frames/--max-frames" in capsys.readouterr().err
    for flag in ("--capacity-ttfa-p95-ms", "--capacity-underrun-pct"):
        with pytest.raises(SystemExit):
            bs.parse_args(["--rate", "1", flag, "0"])
        assert f"argument {flag}: must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bs.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--clip-frames-dist fixed|uniform:LO:HI" in help_text and "uniform:LO:HI" in help_text
    assert "capacity:" in help_text and "capacity_rps_contiguous" in help_text


def _fake_open_run(tmp_path, *args):
    import io

    bs = _load_benchmark()
    FakeClient.sent = []
    ds = tmp_path / "ds.lst"
    ds.write_text("a\tfirst text\nb\tsecond text\n", encoding="utf-8")
    out = tmp_path / "cap.json"
    a = bs.parse_args(
        ["--dataset", str(ds), "--language", "english", "--no-progress", "--out-json", str(out), *args]
        + ["--out-csv", str(tmp_path / "cap.csv")]
    )
    buf = io.StringIO()
    res = bs.run(a, client_factory=FakeClient, out=buf)
    return res, json.loads(out.read_text()), buf.getvalue(), (tmp_path / "cap.csv").read_text()


def test_open_loop_uniform_clips_and_capacity_in_json(tmp_path):
    # the fake answers in 10-30 ms with no underrun: every level passes a 5 s TTFA bound
    common = ["--requests-per-level", "6", "--warmup", "1", "--seed", "2", "--clip-frames-dist", "uniform:5:9"]
    res, js, out, csv_text = _fake_open_run(tmp_path, "--rate", "40", "80", *common, "--capacity-ttfa-p95-ms", "5000")
    assert len(FakeClient.sent) == 2 * (6 + 1)
    assert all(5 <= s["max_frames"][0] <= 9 and s["ignore_eos"] == [True] for s in FakeClient.sent)
    assert all(5 <= row["max_frames"] <= 9 for row in js["requests"])
    assert js["capacity_rps"] == 80.0 and js["capacity_rps_contiguous"] == 80.0
    assert js["capacity_ttfa_p95_ms"] == 5000.0 and js["capacity_underrun_pct"] == 1.0
    assert [lvl["capacity_pass"] for lvl in js["levels"]] == [True, True]
    assert [lvl["underrun_pct"] for lvl in js["levels"]] == [0.0, 0.0]
    assert js["config"]["clip_frames_dist"] == "uniform:5:9"
    last_table = out.rsplit("open loop", 1)[1]
    assert last_table.strip().splitlines()[-1].startswith("capacity: 80 req/s (the highest offered rate")
    assert "underrun_pct" in csv_text.splitlines()[0].split(",")
    # seeded: the same run sends the same lengths in the same order (each send waits for the one before)
    first = [s["max_frames"][0] for s in FakeClient.sent]
    _fake_open_run(tmp_path, "--rate", "40", "80", *common)
    assert first == [s["max_frames"][0] for s in FakeClient.sent]
    assert len(set(first)) > 1


def test_open_loop_capacity_none_and_fixed_default(tmp_path):
    # every TTFA is >= 10 ms (the fake sleeps before its first chunk): a 5 ms bound passes nothing
    res, js, out, _ = _fake_open_run(
        tmp_path, "--rate", "50", "--requests-per-level", "3", "--warmup", "0", "--capacity-ttfa-p95-ms", "5"
    )
    assert js["capacity_rps"] is None and js["capacity_rps_contiguous"] is None
    assert js["levels"][0]["capacity_pass"] is False
    assert "capacity: none: no tested rate passed (the highest offered rate with TTFA p95 <= 5 ms" in out
    assert all("max_frames" not in s and "ignore_eos" not in s for s in FakeClient.sent)  # fixed, no flags: text only
    assert all(row["max_frames"] is None for row in js["requests"])


def test_closed_loop_has_no_capacity(tmp_path):
    import io

    bs = _load_benchmark()
    a = bs.parse_args(["--concurrency", "1", "--requests-per-level", "2", "--warmup", "0", "--texts", "en"])
    a.no_progress = True
    buf = io.StringIO()
    res = bs.run(a, client_factory=FakeClient, out=buf)
    assert "capacity_rps" not in res and "capacity:" not in buf.getvalue()
    assert "capacity_pass" not in res["levels"][0] and res["levels"][0]["underrun_pct"] == 0.0


def test_open_loop_capacity_per_voice_cache_pass(tmp_path):
    import soundfile as sf

    wav = tmp_path / "ref.wav"
    sf.write(str(wav), np.zeros(2400, np.float32), SR)
    res, js, out, _ = _fake_open_run(
        tmp_path,
        *["--rate", "50", "--requests-per-level", "2", "--warmup", "0", "--task", "base"],
        *["--ref-audio", str(wav), "--x-vector-only", "--capacity-ttfa-p95-ms", "5000"],
    )
    assert js["voice_cache"] == ["fresh", "shared"]
    assert "capacity_rps" not in js  # not the first pass's alone
    assert js["capacity_by_voice_cache"] == {
        w: {
            "capacity_rps": 50.0,
            "capacity_rps_contiguous": 50.0,
            "capacity_ttfa_p95_ms": 5000.0,
            "capacity_underrun_pct": 1.0,
        }
        for w in ("fresh", "shared")
    }
    assert out.count("capacity: 50 req/s") == 2
