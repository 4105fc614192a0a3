"""Validation of `tts` requests: every bad input names its field and the allowed values."""

import numpy as np
import pytest

from triton_qwen3_tts.serving.tts.request import RequestError, TtsLimits, parse_tts_request


def b(s):
    return np.array([s.encode("utf-8") if isinstance(s, str) else s], dtype=object)


LIM = TtsLimits(default_speaker="vivian", max_text_chars=50, max_frames_limit=100, default_max_frames=80)
AUDIO = (0.1 * np.sin(np.arange(24000 * 2) / 10)).astype(np.float32)


def parse(**kw):
    return parse_tts_request(kw, LIM)


def test_defaults():
    r = parse(text=b("Hello"))
    assert (r.task_type, r.speaker, r.language, r.sample_format, r.stream) == (
        "CustomVoice",
        "vivian",
        "auto",
        "float32",
        True,
    )
    assert (r.temperature, r.top_k, r.max_frames, r.seed, r.ignore_eos) == (0.9, 50, 80, None, False)


def test_values_are_normalised():
    r = parse(
        text=b("Hi"),
        task_type=b("customvoice"),
        speaker=b(" Eric "),
        language=b("Chinese"),
        sample_format=b("INT16"),
        stream=np.array([False]),
        temperature=np.array([0.0], np.float32),
        top_k=np.array([3], np.int32),
        seed=np.array([7], np.int64),
        max_frames=np.array([[5]], np.int32),
    )
    assert (r.task_type, r.speaker, r.language, r.sample_format, r.stream) == (
        "CustomVoice",
        "eric",
        "chinese",
        "int16",
        False,
    )
    assert (r.temperature, r.top_k, r.seed, r.max_frames) == (0.0, 3, 7, 5)


@pytest.mark.parametrize(
    "kw,field,msg",
    [
        (dict(text=b("")), "text", "empty"),
        (dict(text=b("   \n")), "text", "whitespace"),
        (dict(text=b("x" * 51)), "text", "limit is 50"),
        (dict(text=b(b"\xff\xfe")), "text", "UTF-8"),
        (dict(), "text", "required"),
        (dict(text=b("a"), task_type=b("Cloning")), "task_type", "CustomVoice, VoiceDesign, Base"),
        (dict(text=b("a"), task_type=b("VoiceDesign")), "instruct", "required"),
        (dict(text=b("a"), task_type=b("Base")), "ref_audio", "needs ref_audio"),
        (dict(text=b("a"), sample_format=b("mp3")), "sample_format", "float32, int16"),
        (dict(text=b("a"), temperature=np.array([-1.0], np.float32)), "temperature", ">= 0"),
        (dict(text=b("a"), temperature=np.array([np.nan], np.float32)), "temperature", "finite"),
        (dict(text=b("a"), top_k=np.array([0], np.int32)), "top_k", "[1, 2048]"),
        (dict(text=b("a"), max_frames=np.array([0], np.int32)), "max_frames", "[1, 100]"),
        (dict(text=b("a"), max_frames=np.array([101], np.int32)), "max_frames", "[1, 100]"),
        (dict(text=np.array([b"a", b"b"], dtype=object)), "text", "shape [1]"),
        (dict(text=b("a"), top_k=np.array([1.5], np.float32)), "top_k", "integer"),
        (dict(text=b("a"), stream=np.array([1], np.int32)), "stream", "BOOL"),
        (dict(text=b("a"), bogus=b("x")), "bogus", "unknown input"),
        (dict(text=b("a"), ref_text=b("hi")), "ref_text", "only used with task_type Base"),
    ],
)
def test_invalid(kw, field, msg):
    with pytest.raises(RequestError) as e:
        parse(**kw)
    assert e.value.field == field
    assert msg in str(e.value)


def base(**kw):
    d = dict(
        text=b("a"),
        task_type=b("Base"),
        ref_audio=AUDIO,
        ref_sample_rate=np.array([24000], np.int32),
        ref_text=b("hello"),
    )
    d.update(kw)
    return d


def test_base_ok_and_xvector_only():
    r = parse(**base())
    assert r.ref_audio.shape == (48000,) and r.ref_text == "hello" and not r.x_vector_only
    r = parse(**base(ref_text=None, x_vector_only=np.array([True])))
    assert r.x_vector_only


@pytest.mark.parametrize(
    "kw,field,msg",
    [
        (dict(ref_audio=AUDIO[:1000]), "ref_audio", "at least"),
        (dict(ref_audio=np.zeros(24000 * 40, np.float32)), "ref_audio", "at most"),
        (dict(ref_audio=np.zeros(48000, np.float32)), "ref_audio", "silence"),
        (dict(ref_audio=np.where(np.arange(48000) == 5, np.nan, AUDIO).astype(np.float32)), "ref_audio", "NaN"),
        (dict(ref_audio=(AUDIO * 1000).astype(np.int16)), "ref_audio", "FP32"),
        (dict(ref_sample_rate=np.array([12345], np.int32)), "ref_sample_rate", "not supported"),
        (dict(ref_sample_rate=None), "ref_sample_rate", "required"),
        (dict(ref_text=None), "ref_text", "x_vector_only"),
        (dict(ref_audio=np.stack([AUDIO, AUDIO])), "ref_audio", "mono"),
    ],
)
def test_invalid_reference(kw, field, msg):
    with pytest.raises(RequestError) as e:
        parse(**base(**kw))
    assert e.value.field == field and msg in str(e.value)


def test_limits_validate_themselves():
    with pytest.raises(ValueError):
        TtsLimits(default_task_type="Nope")
    with pytest.raises(ValueError):
        TtsLimits(default_max_frames=10, max_frames_limit=5)
