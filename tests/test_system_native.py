"""The tts model works unchanged with the native talker engine (issue 7): real tritonserver,
`engine: native` on CPU (eager), tiny random checkpoint, Python codec."""

import time

import numpy as np
import pytest
from system_support import make_reference, metric, start_tts_server, synth

pytestmark = pytest.mark.system

TEXT = "The native engine behind the same tts model."


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    srv = start_tts_server(tiny_checkpoint, tmp_path_factory.mktemp("tts_native"), engine="native",
                           left_context_frames=150, max_model_len=4200, max_frames_limit=4000)
    yield srv
    srv.stop()


def test_greedy_stream_equals_reference_whole_decode(server, tiny_checkpoint):
    _, whole = make_reference(tiny_checkpoint)(TEXT, frames=30)
    r = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=30)
    assert r.audio.shape == whole.shape
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    assert [n // 1920 for _, n in r.chunks][0] == 2


def test_cancels_end_cleanly(server):
    """Long requests (4000 frames) cancelled after their first chunk: the tts sees every cancel,
    aborts the talker, and nothing stays in flight."""
    from qwen3_tts_triton.client import StreamingClient, build_inputs

    before = metric(server, "qwen3_tts_requests_cancelled_total")
    for i in range(5):
        c = StreamingClient(server.grpc_url)
        rid = c.send(build_inputs(text=f"cancel {i}", max_frames=4000, ignore_eos=True))
        c.queues[rid].get(timeout=60)
        c.close(cancel=True)
    deadline = time.time() + 30
    while time.time() < deadline and metric(server, "qwen3_tts_requests_cancelled_total") - before < 5:
        time.sleep(0.3)
    assert metric(server, "qwen3_tts_requests_cancelled_total") - before >= 5
    assert metric(server, "qwen3_tts_requests_in_flight") == 0
    assert metric(server, "qwen3_tts_talker_aborted_total") >= 5
    assert synth(server, text="after cancels", max_frames=4).audio.size == 4 * 1920
