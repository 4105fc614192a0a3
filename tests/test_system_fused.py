"""The fused pipeline through the real tritonserver (CPU, eager, tiny random checkpoint):
`pipeline: fused` with the native engine: the repository has one model, the tts, which hosts the
talker engine and its codec in its own process.

Concurrent greedy streams of different lengths each equal the reference's frames decoded in one
piece (within 1e-4), as the split pipeline's stateful codec does (test_stateful_serving.py); a
cancelled stream frees its talker request; a bad input is INVALID_ARG naming its field and does
not disturb the others; the fused metrics are exported.
"""

import threading
import time

import numpy as np
import pytest
from system_support import make_reference, metric, server_state, start_tts_server, synth, wait_idle

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    srv = start_tts_server(
        tiny_checkpoint,
        tmp_path_factory.mktemp("tts_fused"),
        engine="native",
        pipeline="fused",
        first_chunk_frames=1,
        chunk_ramp="2,4",
        chunk_frames=8,
    )
    yield srv
    srv.stop()


def test_repository_has_only_the_tts_model(server):
    import os

    repo = os.path.join(os.path.dirname(server.log_path), "repo")  # start_tts_server's layout
    assert sorted(os.listdir(repo)) == ["build.json", "tts"]


def test_concurrent_greedy_streams_equal_whole_decode(server, tiny_checkpoint):
    ref = make_reference(tiny_checkpoint)
    cases = [("A fused stream.", 24), ("Another one, shorter.", 9), ("And a third of middling length.", 16)]
    results, errors = {}, []

    def run(i, text, frames):
        try:
            results[i] = synth(server, text=text, speaker="aiden", temperature=0.0, max_frames=frames)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, t, f)) for i, (t, f) in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, (errors, server_state(server))
    for i, (text, frames) in enumerate(cases):
        codes, whole = ref(text, frames=frames)
        r = results[i]
        assert r.audio.shape == whole.shape, (text, r.audio.shape, whole.shape)
        np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
        sizes = [n // 1920 for _, n in r.chunks if n]
        assert sizes[0] == 1  # first_chunk_frames
    deadline = time.time() + 10  # the talker exports its histograms once a second
    while metric(server, "qwen3_tts_fused_codec_batch_size_count") < 3:
        assert time.time() < deadline, "no fused codec batches in the metrics"
        time.sleep(0.2)
    # each stream's time before its first frame and after its last, once per request
    for name in (
        "qwen3_tts_fused_first_frame_seconds_count",
        "qwen3_tts_fused_tail_seconds_count",
        "qwen3_tts_fused_rest_frames_count",
    ):
        while metric(server, name) < len(cases):
            assert time.time() < deadline, f"{name} counts fewer than the {len(cases)} requests"
            time.sleep(0.2)
    # the engine's device time per kind of launch (the host clock on this CPU): the requests'
    # prefills and first-chunk calls (batched: one launch may serve several; the warm-up's are
    # not exported), their steps
    launches = lambda kind: metric(server, "qwen3_tts_fused_device_launches_total", f'kind="{kind}"')  # noqa: E731
    while launches("step_b[0-9]+") < max(f for _, f in cases):  # the longest request's steps at least
        assert time.time() < deadline, "the steps are missing from the device-time counters"
        time.sleep(0.2)
    assert launches("prefill") >= 1 and launches("codec_first") >= 1
    assert metric(server, "qwen3_tts_fused_device_seconds_total", 'kind="step_b[0-9]+"') > 0
    # and the gaps between them, by transition (a request's steps follow each other)
    gaps = lambda t: metric(server, "qwen3_tts_fused_device_gaps_total", f'transition="{t}"')  # noqa: E731
    while gaps("step>step") < 1:
        assert time.time() < deadline, "the gaps between steps are missing from the gap counters"
        time.sleep(0.2)


def test_cancel_ends_the_stream_and_the_server_serves_on(server):
    from triton_qwen3_tts.tools.client import StreamingClient, build_inputs

    aborted0 = metric(server, "qwen3_tts_requests_cancelled_total")
    c = StreamingClient(server.grpc_url)
    try:
        rid = c.send(build_inputs(text="A long one to cancel.", speaker="aiden", max_frames=400, ignore_eos=True))
        result, error, _ = c.queues[rid].get(timeout=120)
        assert error is None and result.as_numpy("audio").size > 0
    finally:
        c.close(cancel=True)
    wait_idle(server)
    deadline = time.time() + 60
    while metric(server, "qwen3_tts_requests_cancelled_total") <= aborted0:
        assert time.time() < deadline, server_state(server)
        time.sleep(0.2)
    # the server serves on
    r = synth(server, text="Still here.", speaker="aiden", temperature=0.0, max_frames=5)
    assert r.audio.size == 5 * 1920


def test_bad_input_is_invalid_arg_and_others_go_on(server):
    from triton_qwen3_tts.tools.client import TtsError

    with pytest.raises(TtsError, match=r"INVALID_ARG.*speaker"):
        synth(server, text="Who?", speaker="nobody-here", max_frames=5)
    with pytest.raises(TtsError, match=r"INVALID_ARG.*top_k"):
        synth(server, text="Too many.", speaker="aiden", top_k=100000, max_frames=5)
    r = synth(server, text="Fine.", speaker="aiden", temperature=0.0, max_frames=6)
    assert r.audio.size == 6 * 1920
