"""The tts model works unchanged with the native talker engine (issue 7): real tritonserver,
`engine: native` on CPU (eager), tiny random checkpoint, Python codec."""

import numpy as np
import pytest
from system_support import make_reference, metric, start_tts_server, synth

pytestmark = pytest.mark.system

TEXT = "The native engine behind the same tts model."


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    srv = start_tts_server(tiny_checkpoint, tmp_path_factory.mktemp("tts_native"), engine="native",
                           left_context_frames=150)
    yield srv
    srv.stop()


def test_greedy_stream_equals_reference_whole_decode(server, tiny_checkpoint):
    _, whole = make_reference(tiny_checkpoint)(TEXT, frames=30)
    responses0 = metric(server, "qwen3_tts_talker_responses_total")
    r = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=30)
    talker_responses = metric(server, "qwen3_tts_talker_responses_total") - responses0
    assert r.audio.shape == whole.shape
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    chunks = [n // 1920 for _, n in r.chunks if n]
    assert chunks[0] == 2
    # frame coalescing: at most one talker response per tts chunk, not one per engine step
    assert 1 <= talker_responses <= len(chunks) < sum(chunks), (talker_responses, chunks)
