"""One mapping of errors across the BLS hop (serving/errors.py): a talker or codec error
``[CODE] field: message`` is parsed back and re-raised with its own code and field, so the client
sees it once, as the model wrote it. No Triton here: fakes stand for pb_utils' error objects."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.engines.base import EngineError, check_prompt_frames_trailing, check_sampling_fields
from triton_qwen3_tts.model.prompt import PromptError, validate_request
from triton_qwen3_tts.serving.tts.admission import Overloaded
from triton_qwen3_tts.serving.errors import (
    CODE_NAMES,
    DownstreamError,
    InvalidInput,
    as_request_error,
    code_name_of,
    downstream_error,
    error_code_name,
    parse_error_message,
    triton_error,
)
from triton_qwen3_tts.serving.faults import Unavailable
from triton_qwen3_tts.serving.model_config import TtsModelConfig
from triton_qwen3_tts.serving.tts.pipeline import Cancelled
from triton_qwen3_tts.serving.tts.request import RequestError
from triton_qwen3_tts.serving.talker.service import TalkerService
from triton_qwen3_tts.serving.tts.service import TtsService
from test_tts_service import Sender  # the tts tests' recording sender

TINY = Qwen3TTSConfig.from_dict(presets.main_config("tiny"))


class Codes:
    """Stands for pb_utils.TritonError's code constants."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)


class TritonErr:
    """Stands for the error of a BLS response (``.message()``, ``.code()``)."""

    def __init__(self, message, code):
        self._m, self._c = message, code

    def message(self):
        return self._m

    def code(self):
        return self._c


def wire(err):
    """What a model of this repository sends for ``err`` (the ``_error`` helpers): message and code."""
    name = error_code_name(err)
    return TritonErr(f"[{name}] {err}", getattr(Codes, name))


@pytest.mark.parametrize(
    "message,expected",
    [
        (
            "[INVALID_ARG] max_frames: max_frames=5000 exceeds max_model_len",
            ("INVALID_ARG", "max_frames", "max_frames=5000 exceeds max_model_len"),
        ),
        (
            "[INVALID_ARG] text: has 2001 characters; the limit is 2000",
            ("INVALID_ARG", "text", "has 2001 characters; the limit is 2000"),
        ),
        ("[UNAVAILABLE] every codec state slot is taken", ("UNAVAILABLE", None, "every codec state slot is taken")),
        ("[request id: tts-1] [INTERNAL] aborted", ("INTERNAL", None, "aborted")),
        (
            "[INVALID_ARG] EngineConfig.max_model_len: must be >= 3",
            ("INVALID_ARG", "EngineConfig.max_model_len", "must be >= 3"),
        ),
        ("codes must lie in [0, 2048)", ("INTERNAL", None, "codes must lie in [0, 2048)")),  # no prefix
        ("CUDA error: out of memory", ("INTERNAL", None, "CUDA error: out of memory")),  # not an input name
        # an old doubly wrapped message: only the first prefix is taken
        ("[INTERNAL] talker: [INVALID_ARG] max_frames: x", ("INTERNAL", "talker", "[INVALID_ARG] max_frames: x")),
    ],
)
def test_parse_error_message(message, expected):
    assert parse_error_message(message) == expected


def test_parse_error_message_default_code():
    assert parse_error_message("bad shape", "INVALID_ARG") == ("INVALID_ARG", None, "bad shape")
    assert parse_error_message("[UNAVAILABLE] x", "INVALID_ARG")[0] == "UNAVAILABLE"  # the message wins
    with pytest.raises(ValueError):
        parse_error_message("x", "NOPE")


def test_code_name_of():
    assert code_name_of(Codes.INVALID_ARG, Codes) == "INVALID_ARG"
    assert code_name_of("CANCELLED") == "CANCELLED"
    assert code_name_of(99, Codes) == "INTERNAL"


@pytest.mark.parametrize("code", CODE_NAMES)
def test_every_code_maps_back_to_itself(code):
    e = downstream_error("talker", TritonErr(f"[{code}] top_k: too big", Codes.INTERNAL), Codes)
    assert isinstance(e, DownstreamError) and error_code_name(e) == code
    assert (e.field, e.text, e.model, str(e)) == ("top_k", "too big", "talker", "top_k: too big")
    assert isinstance(e, RequestError) == (code == "INVALID_ARG")
    assert isinstance(e, Unavailable) == (code == "UNAVAILABLE")


def test_response_code_is_used_when_the_message_has_none():
    # the codec models send plain messages with a Triton code
    e = downstream_error(
        "codec_decoder_stateful", TritonErr("every codec state slot is taken", Codes.UNAVAILABLE), Codes
    )
    assert error_code_name(e) == "UNAVAILABLE" and str(e) == "codec_decoder_stateful: every codec state slot is taken"
    e = downstream_error("codec_decoder", TritonErr("audio_codes: bad shape", Codes.INVALID_ARG), Codes)
    assert error_code_name(e) == "INVALID_ARG" and e.field == "audio_codes"
    e = downstream_error("codec_decoder", TritonErr("unexpected shape for input", Codes.INVALID_ARG), Codes)
    assert error_code_name(e) == "INVALID_ARG" and e.field == "codec_decoder"  # names the model
    e = downstream_error("talker", "[INTERNAL] aborted")  # a plain message string
    assert error_code_name(e) == "INTERNAL" and str(e) == "talker: aborted"


@pytest.mark.parametrize(
    "err",
    [
        RequestError("max_frames", "max_frames=5000 exceeds max_model_len - prompt_len - 1 = 3000"),
        PromptError("speaker", "unknown speaker 'bob'"),
        Overloaded("admission limit reached"),
        RuntimeError("engine died"),
        Cancelled("cancelled"),
    ],
)
def test_round_trip_keeps_code_and_message(err):
    """What a model sends for its error comes back, after the hop, as the same code and text;
    the tts then writes its own prefix once."""
    e = downstream_error("talker", wire(err), Codes)
    assert error_code_name(e) == error_code_name(err)
    if getattr(err, "field", None):
        assert e.field == err.field and str(e) == str(err)
    else:
        assert str(e) == f"talker: {err}"
    client = f"[{error_code_name(e)}] {e}"
    assert client.count("[") - str(err).count("[") == 1  # one code prefix


def test_engine_error_field():
    assert error_code_name(EngineError("engine not started")) == "INTERNAL"  # no input's fault
    assert EngineError("x", field="max_frames").field == "max_frames"
    assert error_code_name(EngineError("x", field="max_frames")) == "INVALID_ARG"


@pytest.mark.parametrize(
    "err,field,text",
    [
        (PromptError("text", "must be a non-empty string"), "text", "must be a non-empty string"),
        (
            EngineError("max_frames=9 exceeds max_model_len - prompt_len - 1 = 3", field="max_frames"),
            "max_frames",
            "max_frames=9 exceeds max_model_len - prompt_len - 1 = 3",
        ),
        (
            EngineError("top_k=100 > max_top_k=64 (NativeEngineConfig)"),
            "top_k",
            "top_k=100 > max_top_k=64 (NativeEngineConfig)",
        ),
        (EngineError("prompt of 9000 rows is too long"), "text", "prompt of 9000 rows is too long"),
        (RequestError("seed", "must be in [0, 2^63)"), "seed", "must be in [0, 2^63)"),
    ],
)
def test_as_request_error_names_the_field_once(err, field, text):
    r = as_request_error(err)
    assert isinstance(r, RequestError) and r.field == field and str(r) == f"{field}: {text}"


def test_engine_frame_limit_carries_its_field():
    req = SimpleNamespace(
        prompt_embeds=np.zeros((20, 8), np.float32), trailing=None, max_frames=50, greedy=True, temperature=1.0
    )
    with pytest.raises(EngineError, match="exceeds max_model_len") as e:
        check_prompt_frames_trailing(req, 8, max_model_len=64, max_trailing_tokens=4)
    assert e.value.field == "max_frames"
    req.max_frames, req.trailing = 4, np.zeros((5, 8), np.float32)
    with pytest.raises(EngineError, match="max_trailing_tokens") as e:
        check_prompt_frames_trailing(req, 8, max_model_len=64, max_trailing_tokens=4)
    assert e.value.field == "text"


# -- the whole way: talker service -> talker model's error -> BLS -> tts service -> sender ----------


class FakeFrontend:
    config = TINY

    def validate(self, req):
        return validate_request(TINY, req)

    def build(self, req, spk):
        return SimpleNamespace(prompt_embeds=np.zeros((20, TINY.talker.hidden_size), np.float32), trailing=None)


class FakeEngine:
    """Refuses what the real engines refuse (engine.check_prompt_frames_trailing), context 64."""

    async def synthesize(self, req):
        check_prompt_frames_trailing(req, TINY.talker.hidden_size, 64, 512)
        yield np.zeros((1, 16), np.int32)

    async def abort(self, rid):
        pass


class TalkerOverBLS:
    """The tts's view of the talker model: its service's error sent as the talker model sends it,
    with the response code lost on the way (the BLS answered INTERNAL once), then parsed back as
    the tts adapter does (model_repository/tts/1/model.py, _TalkerBLS.stream)."""

    def __init__(self):
        self.service = TalkerService(FakeFrontend(), FakeEngine())
        self.aborted = []

    async def stream(self, rid, inputs):
        try:
            async for frames in self.service.stream(rid, inputs):
                yield frames
        except Exception as e:  # noqa: BLE001 - what talker/1/model.py sends
            sent = wire(e)
            raise downstream_error("talker", TritonErr(sent.message(), Codes.INTERNAL), Codes) from None

    async def abort(self, rid):
        self.aborted.append(rid)


class FakeCodec:
    async def decode(self, codes, left):
        return np.zeros(codes.shape[0] * 1920, np.float32)


def test_talker_max_frames_refusal_reaches_the_client_once():
    talker, send = TalkerOverBLS(), Sender()
    svc = TtsService(TtsModelConfig(checkpoint="/x"), TINY, talker, FakeCodec())
    inputs = {"text": np.array([b"hello"], dtype=object), "max_frames": np.array([100], np.int32)}
    asyncio.run(svc.handle(inputs, send))
    assert len(send.items) == 1 and send.items[0][0] == "error"
    err = send.items[0][1]
    assert error_code_name(err) == "INVALID_ARG" and err.field == "max_frames"
    client = f"[{error_code_name(err)}] {err}"  # what the tts model's sender writes
    assert client.startswith("[INVALID_ARG] max_frames: max_frames=100 exceeds"), client
    assert client.count("max_frames:") == 1 and client.count("[") == 1 and "talker" not in client, client
    assert talker.aborted and svc.admission.in_flight == 0


class SamplingEngine(FakeEngine):
    """Records each request and refuses sampling as the native engine does (candidate limit 64)."""

    def __init__(self):
        self.reqs = []

    async def synthesize(self, req):
        check_sampling_fields(req, TINY.talker.vocab_size, 2048, max_top_k=64)
        self.reqs.append(req)
        async for f in super().synthesize(req):
            yield f


def _tts_over_bls(engine):
    talker = TalkerOverBLS()
    talker.service.engine = engine
    return talker, TtsService(TtsModelConfig(checkpoint="/x"), TINY, talker, FakeCodec())


def test_tts_sampling_inputs_reach_the_engine():
    """Every generation control of a tts request arrives in the engine's TalkerRequest, through
    the talker's inputs (the BLS hop): codebook 0 and, separately, the code predictor."""
    engine = SamplingEngine()
    _, svc = _tts_over_bls(engine)
    inputs = {
        "text": np.array([b"hello"], dtype=object),
        "max_frames": np.array([2], np.int32),
        "temperature": np.array([0.5], np.float32),
        "top_k": np.array([40], np.int32),
        "top_p": np.array([0.75], np.float32),
        "repetition_penalty": np.array([1.25], np.float32),
        "subtalker_temperature": np.array([0.0], np.float32),
        "subtalker_top_k": np.array([8], np.int32),
        "subtalker_top_p": np.array([0.5], np.float32),
    }
    send = Sender()
    asyncio.run(svc.handle(inputs, send))
    assert send.items[-1][0] != "error", send.items
    (r,) = engine.reqs
    assert (r.greedy, r.temperature, r.top_k, r.top_p, r.repetition_penalty) == (False, 0.5, 40, 0.75, 1.25)
    assert (r.sub_greedy, r.sub_top_k, r.sub_top_p) == (True, 8, 0.5)
    # left out: the checkpoint's defaults (here the official ones); subtalker_* follow temperature
    engine.reqs.clear()
    inputs = {"text": np.array([b"hello"], dtype=object), "max_frames": np.array([2], np.int32)}
    asyncio.run(svc.handle({**inputs, "temperature": np.array([0.0], np.float32)}, Sender()))
    asyncio.run(svc.handle(inputs, Sender()))
    greedy, default = engine.reqs
    assert (greedy.greedy, greedy.sub_greedy) == (True, True)
    assert (default.greedy, default.temperature, default.top_k, default.top_p, default.repetition_penalty) == (
        False,
        pytest.approx(0.9),
        50,
        1.0,
        pytest.approx(1.05),
    )
    assert (default.sub_greedy, default.sub_temperature, default.sub_top_k, default.sub_top_p) == (
        False,
        pytest.approx(0.9),
        50,
        1.0,
    )


@pytest.mark.parametrize("name", ["top_k", "subtalker_top_k"])
def test_engine_top_k_limit_reaches_the_client_naming_the_input(name):
    _, svc = _tts_over_bls(SamplingEngine())
    send = Sender()
    inputs = {"text": np.array([b"hello"], dtype=object), name: np.array([65], np.int32)}
    asyncio.run(svc.handle(inputs, send))
    assert len(send.items) == 1 and send.items[0][0] == "error", send.items
    err = send.items[0][1]
    assert error_code_name(err) == "INVALID_ARG" and err.field == name
    assert f"{name} must be in [1, 64]" in str(err), str(err)


class _FakeTritonError:
    """Stands for pb_utils.TritonError: (message, code), codes as class attributes."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message, code):
        self.message, self.code = message, code


@pytest.mark.parametrize(
    "err,code",
    [
        (InvalidInput("audio_codes: expected [b, T, 16], got [1, 3]"), "INVALID_ARG"),
        (RequestError("speaker", "unknown speaker 'x'; allowed: a, b"), "INVALID_ARG"),
        (Unavailable("all 2 codec state slots are in use"), "UNAVAILABLE"),
        (RuntimeError("codec decode failed: boom"), "INTERNAL"),
        (ValueError("a bug, not an input"), "INTERNAL"),
    ],
)
def test_triton_error_is_the_one_mapping(err, code):
    e = triton_error(err, _FakeTritonError)
    assert e.code == getattr(_FakeTritonError, code)
    assert e.message == f"[{code}] {err}"
    assert parse_error_message(e.message)[0] == code  # the tts reads back what a model sent


def test_state_capacity_is_unavailable():
    from triton_qwen3_tts.serving.codec.stateful import StateCapacityError

    assert error_code_name(StateCapacityError("full")) == "UNAVAILABLE"


def test_only_the_errors_module_builds_triton_errors():
    """Every Triton layer answers errors through errors.triton_error, never a code of its own."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "triton_qwen3_tts" / "serving"
    offenders = [
        f"{p.relative_to(root)}:{n}"
        for p in sorted(root.rglob("triton.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "TritonError(" in line or "TritonError." in line.replace("pb_utils.TritonError)", "")
    ]
    assert not offenders, offenders
