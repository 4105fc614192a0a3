"""Validation of `tts` requests: every bad input names its field and the allowed values."""

import numpy as np
import pytest

from triton_qwen3_tts.model.config import GenerationDefaults
from triton_qwen3_tts.serving.tts.request import RequestError, Sampling, TtsLimits, parse_tts_request


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
    assert (r.max_frames, r.seed, r.ignore_eos) == (80, None, False)
    # the official generation_config.json (talker and code predictor)
    assert r.sampling == Sampling(0.9, 50, 1.0, 1.05, 0.9, 50, 1.0)


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
    assert (r.sampling.temperature, r.sampling.top_k, r.seed, r.max_frames) == (0.0, 3, 7, 5)


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
        (dict(text=b("a"), top_k=np.array([2049], np.int32)), "top_k", "[1, 2048]"),
        (dict(text=b("a"), top_p=np.array([0.0], np.float32)), "top_p", "(0, 1]"),
        (dict(text=b("a"), top_p=np.array([1.5], np.float32)), "top_p", "(0, 1]"),
        (dict(text=b("a"), top_p=np.array([np.nan], np.float32)), "top_p", "(0, 1]"),
        (dict(text=b("a"), top_p=np.array([1], np.int32)), "top_p", "float"),
        (dict(text=b("a"), repetition_penalty=np.array([0.0], np.float32)), "repetition_penalty", "> 0"),
        (dict(text=b("a"), repetition_penalty=np.array([-1.1], np.float32)), "repetition_penalty", "> 0"),
        (dict(text=b("a"), repetition_penalty=np.array([np.inf], np.float32)), "repetition_penalty", "finite"),
        (dict(text=b("a"), subtalker_temperature=np.array([-0.5], np.float32)), "subtalker_temperature", ">= 0"),
        (dict(text=b("a"), subtalker_temperature=np.array([np.inf], np.float32)), "subtalker_temperature", "finite"),
        (dict(text=b("a"), subtalker_top_k=np.array([0], np.int32)), "subtalker_top_k", "[1, 2048]"),
        (dict(text=b("a"), subtalker_top_k=np.array([4096], np.int32)), "subtalker_top_k", "[1, 2048]"),
        (dict(text=b("a"), subtalker_top_k=np.array([5.0], np.float32)), "subtalker_top_k", "integer"),
        (dict(text=b("a"), subtalker_top_p=np.array([0.0], np.float32)), "subtalker_top_p", "(0, 1]"),
        (dict(text=b("a"), subtalker_top_p=np.array([1.01], np.float32)), "subtalker_top_p", "(0, 1]"),
        # a talker value that follows into the code predictor is named as given
        (dict(text=b("a"), top_p=np.array([2.0], np.float32)), "top_p", "(0, 1]"),
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


def test_sampling_inputs_each_set():
    r = parse(
        text=b("Hi"),
        temperature=np.array([0.7], np.float32),
        top_k=np.array([30], np.int32),
        top_p=np.array([0.8], np.float32),
        repetition_penalty=np.array([1.2], np.float32),
        subtalker_temperature=np.array([0.0], np.float32),
        subtalker_top_k=np.array([7], np.int32),
        subtalker_top_p=np.array([0.5], np.float32),
    )
    got = r.sampling
    assert (got.temperature, got.top_k, got.repetition_penalty, got.subtalker_temperature, got.subtalker_top_k) == (
        pytest.approx(0.7),
        30,
        pytest.approx(1.2),
        0.0,
        7,
    )
    assert (got.top_p, got.subtalker_top_p) == (pytest.approx(0.8), 0.5)


def test_subtalker_follows_the_requests_talker_values():
    """A left-out subtalker_* takes the request's own talker value when it gives one (temperature
    0 stays greedy for both stages), else the default; a given one stands alone."""
    r = parse(text=b("Hi"), temperature=np.array([0.0], np.float32), top_k=np.array([5], np.int32))
    assert (r.sampling.subtalker_temperature, r.sampling.subtalker_top_k, r.sampling.subtalker_top_p) == (0.0, 5, 1.0)
    r = parse(text=b("Hi"), top_p=np.array([0.5], np.float32), subtalker_top_k=np.array([9], np.int32))
    assert (r.sampling.subtalker_top_p, r.sampling.subtalker_top_k, r.sampling.top_k) == (0.5, 9, 50)
    r = parse(text=b("Hi"), temperature=np.array([0.0], np.float32), subtalker_temperature=np.array([0.6], np.float32))
    assert (r.sampling.temperature, r.sampling.subtalker_temperature) == (0.0, pytest.approx(0.6))


def test_sampling_defaults_from_the_checkpoint_generation_config():
    from triton_qwen3_tts.serving.model_config import TtsModelConfig

    gen = GenerationDefaults(
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        repetition_penalty=1.1,
        subtalker_temperature=0.7,
        subtalker_top_k=30,
        subtalker_top_p=0.9,
        subtalker_dosample=False,
    )
    lim = TtsModelConfig(checkpoint="/x").limits("CustomVoice", gen)
    r = parse_tts_request({"text": b("Hi"), "speaker": b("vivian")}, lim)
    # subtalker_dosample false: the code predictor is greedy (temperature 0)
    assert r.sampling == Sampling(0.8, 40, 0.95, 1.1, 0.0, 30, 0.9)
    with pytest.raises(ValueError, match="default_top_p"):
        TtsLimits(default_top_p=0.0)
