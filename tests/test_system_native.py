"""The tts model works unchanged with the native talker engine: real tritonserver,
`engine: native` on CPU (eager), tiny random checkpoint, Python codec.

The server has the README's limits (max_frames_limit 4096, default_max_frames 2048,
max_text_chars 2000, max_instruct_chars 1000) and the talker context the builder sizes from them
(16116 positions; the native engine, because vLLM refuses more than the tiny checkpoint's 4096
max_position_embeddings): every value the README allows is served, and errors keep their field.
"""

import re

import numpy as np
import pytest
from system_support import make_reference, metric, start_tts_server, synth

pytestmark = pytest.mark.system

TEXT = "The native engine behind the same tts model."
# the README's limits, and the talker context sized from them (max_model_len 0)
README_LIMITS = dict(
    max_model_len=0, max_frames_limit=4096, default_max_frames=2048, max_text_chars=2000, max_instruct_chars=1000
)


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    srv = start_tts_server(
        tiny_checkpoint,
        tmp_path_factory.mktemp("tts_native"),
        engine="native",
        left_context_frames=150,
        **README_LIMITS,
    )
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


def test_sampling_inputs_reach_both_stages(server, tiny_checkpoint):
    """As test_system_tts's test of the same name, on the native engine: top-k 1 on both stages
    (any temperature, top-p) with a repetition penalty of 3 is the greedy reference under that
    penalty; a sampling code predictor (subtalker_top_k 50, subtalker_top_p 0.9) is not greedy."""
    ref = make_reference(tiny_checkpoint)
    _, whole3 = ref(TEXT, frames=30, repetition_penalty=3.0)
    one = dict(temperature=0.7, top_k=1, top_p=0.9, subtalker_temperature=1.3, subtalker_top_k=1, subtalker_top_p=0.5)
    r = synth(server, text=TEXT, speaker="aiden", seed=3, max_frames=30, repetition_penalty=3.0, **one)
    np.testing.assert_allclose(r.audio, whole3, atol=1e-4, rtol=0)
    sub = {**one, "subtalker_top_k": 50, "subtalker_top_p": 0.9}
    r = synth(server, text=TEXT, speaker="aiden", seed=3, max_frames=30, repetition_penalty=3.0, **sub)
    assert r.audio.shape == whole3.shape and np.max(np.abs(r.audio - whole3)) > 1e-3


def first_response(server, **kw):
    """Send one request, wait for its first response and cancel the rest (random weights may not
    stop for thousands of frames). Returns the number of audio samples in it; raises TtsError
    when the request was refused."""
    from triton_qwen3_tts.tools.client import StreamingClient, TtsError, build_inputs

    c = StreamingClient(server.grpc_url)
    try:
        rid = c.send(build_inputs(**kw))
        result, error, _ = c.queues[rid].get(timeout=120)
    finally:
        c.close(cancel=True)
    if error is not None:
        raise TtsError(str(error.message() if hasattr(error, "message") else error))
    audio = result.as_numpy("audio")
    return 0 if audio is None else audio.size


def test_readme_maximum_max_frames_is_served(server):
    """max_frames = max_frames_limit (4096) with a short text: before, the talker's 4096 positions
    could not hold it after any prompt ("[INTERNAL] talker: [INVALID_ARG] max_frames: ...")."""
    assert first_response(server, text="Hello there.", speaker="aiden", max_frames=4096) > 0


def test_longest_densest_text_is_served_with_the_default_max_frames(server):
    """2000 characters (max_text_chars) of the densest text there is, 4 tokens per character
    (U+E0100 has no merge: 4 byte tokens), with default_max_frames 2048: an 8000-row prompt."""
    text = "\U000e0100" * 2000
    assert first_response(server, text=text, speaker="aiden") > 0
    # and a dense real-world text: digits (one token each) and CJK extension B (three each)
    assert first_response(server, text="1\U00020000" * 1000, speaker="aiden", temperature=0.0) > 0


def test_over_limit_errors_name_their_field_once(server):
    from triton_qwen3_tts.tools.client import StreamingClient, TtsError

    with pytest.raises(TtsError) as e:  # refused by the tts
        synth(server, text="hi", max_frames=4097)
    msg = str(e.value)
    assert e.value.code == "INVALID_ARG" and msg.count("max_frames:") == 1 and msg.count("[INVALID_ARG]") == 1, msg
    assert "[INVALID_ARG] max_frames: must be in [1, 4096], got 4097" in msg
    # refused by the talker (the native engine keeps at most max_top_k=64 candidates) and passed
    # through the BLS hop: the talker's code and field, once, no "talker:" wrapping
    for name in ("top_k", "subtalker_top_k"):
        with pytest.raises(TtsError) as e:
            first_response(server, text="hi", **{name: 100})
        msg = str(e.value)
        assert e.value.code == "INVALID_ARG" and msg.count("[INVALID_ARG]") == 1, msg
        assert f"[INVALID_ARG] {name}: {name} must be in [1, 64]" in msg, msg
        assert not re.search(r"\btalker\b", msg), msg  # no "talker:" wrapping
    # the talker itself, asked for more frames than its context holds: code and field, once
    with StreamingClient(server.grpc_url, model="talker") as c:
        rid = c.send_raw(
            {"text": (np.array([b"hi"], dtype=object), "BYTES"), "max_frames": (np.array([20000], np.int32), "INT32")}
        )
        with pytest.raises(TtsError) as e:
            c.receive(rid, 0.0, timeout=60)
    msg = str(e.value)
    assert e.value.code == "INVALID_ARG" and msg.count("max_frames:") == 1, msg
    assert "[INVALID_ARG] max_frames: max_frames=20000 exceeds" in msg, msg
    assert server.is_ready()
