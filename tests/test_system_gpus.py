"""One pipeline per GPU through the real tritonserver (CPU, tiny random checkpoint): `gpus 2` with
the fused pipeline, so the tts runs two native engines, each with its codec (on cpu the two
"GPUs" are two engines on the host, as on two GPUs), each in a worker process of its own
(``fused_workers`` process, the default for gpus > 1) or each on an event loop of its own in the
tts process (``fused_workers`` thread); every test but the split one runs on both.

* streams go to the least-loaded GPU (ties: in turn) and each stays on its GPU: the engine of
  each GPU starts exactly the streams routed there and decodes exactly their frames (the per-GPU
  engine metrics, counted inside each engine), and a greedy stream served on the other GPU equals
  the reference's whole decode;
* a cancel storm that fills both GPUs: every stream is aborted on its own GPU's engine, and the
  per-GPU in-flight gauges and codec states return to 0;
* admission: beyond max_in_flight per GPU (2 x 2) plus max_queued (2) requests are refused with
  UNAVAILABLE at once, the admitted ones spread over both GPUs and are served;
* the split pipeline with gpus 2 (talker_0/1, codec_decoder_stateful_0/1; a server of its own for
  one test): Triton's per-model statistics show each stream served by its GPU's talker and codec
  only. (Its repository layout is checked in tests/test_repository.py, the routing in
  tests/test_router.py.)
"""

import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from system_support import make_reference, metric, server_state, start_tts_server, synth, wait_idle

pytestmark = pytest.mark.system

MAX_IN_FLIGHT = 2  # per GPU
MAX_QUEUED = 2


@pytest.fixture(scope="module", params=["auto", "thread"])
def server(request, tiny_checkpoint, tmp_path_factory):
    srv = start_tts_server(
        tiny_checkpoint,
        tmp_path_factory.mktemp("tts_gpus"),
        engine="native",
        pipeline="fused",
        gpus="2",
        fused_workers=request.param,
        max_in_flight=MAX_IN_FLIGHT,
        max_queued=MAX_QUEUED,
        first_chunk_frames=1,
        chunk_ramp="2,4",
        chunk_frames=8,
    )
    srv.workers = request.param
    yield srv
    srv.stop()


def per_gpu(server, name, **labels):
    """{gpu: value} of a metric's gpu-labelled samples (those with every label in ``labels``)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    out = {}
    for m in re.finditer(rf"^{name}{{([^}}]*)}} ([0-9.e+-]+)$", text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if "gpu" in lab and all(lab.get(k) == v for k, v in labels.items()):
            out[int(lab["gpu"])] = out.get(int(lab["gpu"]), 0) + float(m.group(2))
    return out


def delta(after, before):
    return {g: after.get(g, 0) - before.get(g, 0) for g in sorted(set(after) | set(before))}


def wait_for(cond, what, server, timeout=30.0):
    """The engines' metrics are exported once a second: poll until ``cond()``."""
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"{what() if callable(what) else what}; {server_state(server)}"
        time.sleep(0.2)


ENGINE = ("qwen3_tts_engine_streams_total", "qwen3_tts_fused_codec_frames_total", "qwen3_tts_requests_routed_total")


def snapshot(server):
    return {
        "routed": per_gpu(server, "qwen3_tts_requests_routed_total"),
        "started": per_gpu(server, "qwen3_tts_engine_streams_total", state="started"),
        "aborted": per_gpu(server, "qwen3_tts_engine_streams_total", state="aborted"),
        "codec_frames": per_gpu(server, "qwen3_tts_fused_codec_frames_total"),
        "frames": per_gpu(server, "qwen3_tts_frames_total"),
    }


def test_both_gpus_serve_from_the_start(server):
    for name in ("qwen3_tts_requests_in_flight", "qwen3_tts_fused_codec_states", *ENGINE):
        assert set(per_gpu(server, name)) == {0, 1}, (name, server_state(server))
    log = open(server.log_path, errors="replace").read()
    assert "gpu 0: native engine and codec on cpu" in log and "gpu 1: native engine and codec on cpu" in log
    workers = re.findall(r"gpu (\d): native engine and codec on cpu \(worker process (\d+)", log)
    if server.workers == "auto":  # gpus 2: a worker process per GPU, each its own
        assert [g for g, _ in workers] == ["0", "1"] and len({pid for _, pid in workers}) == 2, workers
    else:
        assert workers == []


def test_streams_go_to_the_least_loaded_gpu_and_stay_there(server, tiny_checkpoint):
    from triton_qwen3_tts.tools.client import StreamingClient, build_inputs

    ref = make_reference(tiny_checkpoint)
    wait_idle(server)
    before = snapshot(server)
    long = StreamingClient(server.grpc_url)
    received = 0
    try:
        # A: a long stream, alone: either GPU (a tie; which one depends on the streams before)
        rid = long.send(build_inputs(text="A long one on one GPU.", speaker="aiden", max_frames=400, ignore_eos=True))
        result, error, _ = long.queues[rid].get(timeout=120)
        assert error is None, error
        received += result.as_numpy("audio").size
        routed = delta(per_gpu(server, "qwen3_tts_requests_routed_total"), before["routed"])
        assert sorted(routed.values()) == [0, 1], routed
        a_gpu = 0 if routed[0] == 1 else 1
        o_gpu = 1 - a_gpu
        # B, then C, while A streams: the other GPU, the least loaded, each time
        b = synth(server, text="The second GPU speaks.", speaker="aiden", temperature=0.0, max_frames=24)
        c = synth(server, text="And again.", speaker="aiden", temperature=0.0, max_frames=9)
        assert delta(per_gpu(server, "qwen3_tts_requests_routed_total"), before["routed"]) == {a_gpu: 1, o_gpu: 2}
        assert per_gpu(server, "qwen3_tts_requests_in_flight") == {a_gpu: 1, o_gpu: 0}
    finally:
        long.close(cancel=True)
    _, whole = ref("The second GPU speaks.", frames=24)
    assert b.audio.shape == whole.shape
    np.testing.assert_allclose(b.audio, whole, atol=1e-4, rtol=0)
    wait_idle(server)
    bc = (b.audio.size + c.audio.size) // 1920

    def settled():
        # the engines' counters reach the metrics once a second: the last export may predate C's
        # last codec call although its client has all its audio
        now = snapshot(server)
        return (
            delta(now["aborted"], before["aborted"]).get(a_gpu) == 1
            and delta(now["started"], before["started"]) == {a_gpu: 1, o_gpu: 2}
            and delta(now["codec_frames"], before["codec_frames"]).get(o_gpu, 0) >= bc
            and delta(now["frames"], before["frames"]).get(o_gpu, 0) >= bc
        )

    wait_for(
        settled,
        f"the engines' counts did not reach one stream on GPU {a_gpu} (aborted), two on GPU {o_gpu} with "
        f"{bc} frames decoded",
        server,
    )
    after = snapshot(server)
    # each GPU's engine started exactly the streams routed to it, and decoded only their frames:
    # B's and C's GPU exactly theirs, A's at least what A's client received and nothing of B or C
    assert delta(after["started"], before["started"]) == {a_gpu: 1, o_gpu: 2}, after
    assert delta(after["aborted"], before["aborted"]) == {a_gpu: 1, o_gpu: 0}, after
    codec = delta(after["codec_frames"], before["codec_frames"])
    assert codec[o_gpu] == bc and codec[a_gpu] >= received // 1920, (codec, bc, received)
    assert delta(after["frames"], before["frames"])[o_gpu] == bc


def _open_and_cancel(url, i, opened, go):
    """Open a long stream, wait for its first audio (or an error), then (when ``go`` is set) hang
    up. Returns the error of the first response, or None."""
    from triton_qwen3_tts.tools.client import StreamingClient, build_inputs

    c = StreamingClient(url)
    error = "no response"
    try:
        rid = c.send(build_inputs(text=f"cancel me {i}", speaker="aiden", max_frames=400, ignore_eos=True))
        _, error, _ = c.queues[rid].get(timeout=120)
    finally:
        opened.release()
        try:
            go.wait(120)
        finally:
            c.close(cancel=True)
    return None if error is None else f"{error.status()} {error.message()}"


def test_cancel_storm_over_both_gpus_leaves_nothing_behind(server):
    waves, width = 3, 2 * MAX_IN_FLIGHT  # each wave fills both GPUs
    wait_idle(server)
    before = snapshot(server)
    cancelled0 = metric(server, "qwen3_tts_requests_cancelled_total")
    for w in range(waves):
        wait_idle(server)  # the last wave's cancels have reached the tts: its slots are free
        opened, go = threading.Semaphore(0), threading.Event()
        with ThreadPoolExecutor(width) as pool:
            futs = [pool.submit(_open_and_cancel, server.grpc_url, w * width + i, opened, go) for i in range(width)]
            for _ in range(width):
                assert opened.acquire(timeout=150), server_state(server)
            in_flight = per_gpu(server, "qwen3_tts_requests_in_flight")
            go.set()
            errors = [f.result(timeout=120) for f in futs]
            assert errors == [None] * width, (errors, server_state(server))
            assert in_flight == {0: MAX_IN_FLIGHT, 1: MAX_IN_FLIGHT}
    n = waves * width
    wait_idle(server)

    def aborted_everywhere():
        d = delta(snapshot(server)["aborted"], before["aborted"])
        states = per_gpu(server, "qwen3_tts_fused_codec_states")
        return d == {0: n // 2, 1: n // 2} and states == {0: 0, 1: 0}

    wait_for(
        aborted_everywhere,
        lambda: (
            f"not every cancelled stream was aborted on its GPU, or codec states leaked: {snapshot(server)}, "
            f"before {before}, states {per_gpu(server, 'qwen3_tts_fused_codec_states')}"
        ),
        server,
    )
    after = snapshot(server)
    assert delta(after["routed"], before["routed"]) == {0: n // 2, 1: n // 2}
    assert delta(after["started"], before["started"]) == {0: n // 2, 1: n // 2}
    assert per_gpu(server, "qwen3_tts_requests_in_flight") == {0: 0, 1: 0}
    assert metric(server, "qwen3_tts_requests_cancelled_total") - cancelled0 >= n
    assert synth(server, text="After the storm.", speaker="aiden", max_frames=5).audio.size == 5 * 1920


def test_admission_beyond_every_gpu_is_unavailable(server):
    from triton_qwen3_tts.tools.client import TtsError

    def one(i):
        try:
            synth(server, text=f"burst {i}", speaker="aiden", max_frames=40, ignore_eos=True)
            return "ok"
        except TtsError as e:
            return e.code

    wait_idle(server)
    before = snapshot(server)
    burst = 12
    with ThreadPoolExecutor(burst) as pool:
        codes = list(pool.map(one, range(burst)))
    ok, refused = codes.count("ok"), codes.count("UNAVAILABLE")
    capacity = 2 * MAX_IN_FLIGHT + MAX_QUEUED
    assert ok + refused == burst and refused >= 1 and ok >= capacity, codes
    routed = delta(snapshot(server)["routed"], before["routed"])
    assert sum(routed.values()) == ok and routed[0] >= MAX_IN_FLIGHT and routed[1] >= MAX_IN_FLIGHT, routed
    wait_idle(server)
    assert per_gpu(server, "qwen3_tts_requests_in_flight") == {0: 0, 1: 0}
    assert synth(server, text="Served again.", speaker="aiden", max_frames=4).audio.size == 4 * 1920


def test_split_pipeline_serves_each_stream_on_one_talker_and_codec(tiny_checkpoint, tmp_path):
    """Pipeline split, gpus 2 (native engine, resident stateful codec as on a GPU): talker_0/1 and
    codec_decoder_stateful_0/1. A long stream goes to GPU 0, one started while it runs to GPU 1,
    and Triton's own statistics show each stream served by its GPU's pair only: one talker
    request each, and on each codec one request per chunk its client received plus the release."""
    import os

    import tritonclient.grpc as grpcclient

    srv = start_tts_server(
        tiny_checkpoint,
        tmp_path,
        engine="native",
        codec_mode="stateful",
        gpus="2",
        max_in_flight=MAX_IN_FLIGHT,
        max_queued=MAX_QUEUED,
        first_chunk_frames=1,
        chunk_ramp="2,4",
        chunk_frames=8,
    )
    models = ("talker_0", "talker_1", "codec_decoder_stateful_0", "codec_decoder_stateful_1")

    def requests():
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        out = {}
        for m in models:
            st = c.get_inference_statistics(m, as_json=True)["model_stats"][0]["inference_stats"]
            out[m] = int(st["success"].get("count", 0))
        return out

    try:
        assert sorted(os.listdir(tmp_path / "repo")) == sorted(["build.json", "tts", *models])
        before = requests()
        res = {}
        a = threading.Thread(
            target=lambda: res.__setitem__(
                "a", synth(srv, text="The first GPU's stream.", speaker="aiden", max_frames=400, ignore_eos=True)
            )
        )
        a.start()
        wait_for(lambda: per_gpu(srv, "qwen3_tts_requests_in_flight").get(0) == 1, "stream A not admitted", srv)
        res["b"] = synth(srv, text="The second's.", speaker="aiden", max_frames=20, ignore_eos=True)
        a.join(120)
        assert per_gpu(srv, "qwen3_tts_requests_routed_total") == {0: 1, 1: 1}
        wait_idle(srv)
        chunks = {k: sum(1 for _, n in r.chunks if n) for k, r in res.items()}
        assert res["a"].audio.size == 400 * 1920 and res["b"].audio.size == 20 * 1920

        def served():
            d = {m: v - before[m] for m, v in requests().items()}
            return d == {
                "talker_0": 1,
                "talker_1": 1,
                "codec_decoder_stateful_0": chunks["a"] + 1,
                "codec_decoder_stateful_1": chunks["b"] + 1,
            }

        wait_for(served, lambda: f"per-model requests {requests()} (before {before}), chunks {chunks}", srv)
        assert metric(srv, "qwen3_tts_codec_resident_states") == 0
    finally:
        srv.stop()
