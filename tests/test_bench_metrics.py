"""Metric arithmetic of the service benchmark on hand-computed synthetic timings, plus the
benchmark loop itself against an in-process fake client (no server, no tritonclient)."""

import importlib.util
import json
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
