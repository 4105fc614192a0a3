"""``POST /v1/audio/speech``: validation of the OpenAI request and its mapping to `tts` inputs.

Pure (no server): :func:`parse_speech` turns the JSON body into a :class:`SpeechRequest` or raises
:class:`~.errors.ApiError` (400) naming the field and what is allowed; :func:`tts_inputs` builds the
`tts` model's inputs for it and the voice it names (a stored voice for Base checkpoints, else a
preset speaker). Checks that need the checkpoint (speaker and language names, text length) are the
server's: its INVALID_ARG answer comes back as a 400 naming the request field
(:func:`~.errors.from_triton_message`).

Fields: OpenAI's ``model``, ``input``, ``voice``, ``response_format``, ``speed`` (1.0 only: the
model has no speed control), ``instructions`` (the tts ``instruct``), ``stream_format``
(``audio``: the encoded bytes as they are produced; ``sse``: server-sent events
``speech.audio.delta`` with base64 audio, then ``speech.audio.done``); and Qwen3-TTS's
``language``, ``speaker`` (a preset speaker, overriding ``voice``), the sampling controls under
the tts input names (``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
``subtalker_temperature``, ``subtalker_top_k``, ``subtalker_top_p``: the gateway checks their
types, the tts their ranges), ``seed``, ``max_frames``, ``sample_rate`` (8000-48000 Hz; resampled from 24 kHz by the gateway).
Unknown fields are refused (a misspelt control must not be ignored silently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

from triton_qwen3_tts.gateway.audio import MAX_RATE, MIN_RATE, allowed_rates, supported_formats
from triton_qwen3_tts.gateway.errors import ApiError, bad_request

__all__ = ["SpeechRequest", "parse_speech", "tts_inputs", "SPEECH_FIELDS", "MODEL_RATE"]

MODEL_RATE = 24000  # the tts model's output rate
STREAM_FORMATS = ("audio", "sse")
SPEECH_FIELDS = (
    "model",
    "input",
    "voice",
    "response_format",
    "speed",
    "instructions",
    "stream_format",
    "language",
    "speaker",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "subtalker_temperature",
    "subtalker_top_k",
    "subtalker_top_p",
    "seed",
    "max_frames",
    "sample_rate",
)


@dataclass(frozen=True)
class SpeechRequest:
    model: str
    input: str
    voice: Optional[str]
    response_format: str
    stream_format: str
    sample_rate: int
    instructions: Optional[str] = None
    language: Optional[str] = None
    speaker: Optional[str] = None
    sampling: Dict[str, Any] = field(default_factory=dict)  # temperature, top_k, seed, max_frames


def _str(body: Mapping[str, Any], name: str, required: bool = False) -> Optional[str]:
    v = body.get(name)
    if v is None:
        if required:
            raise bad_request(name, "is required", "missing_field")
        return None
    if not isinstance(v, str):
        raise bad_request(name, f"must be a string, got {type(v).__name__}", "invalid_type")
    if required and not v.strip():
        raise bad_request(name, "is empty", "invalid_value")
    return v


def _number(body: Mapping[str, Any], name: str, integer: bool, lo: float, hi: float) -> Optional[float]:
    v = body.get(name)
    if v is None:
        return None
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (integer and isinstance(v, float) and not v.is_integer())
    ):
        kind = "an integer" if integer else "a number"
        raise bad_request(name, f"must be {kind}, got {v!r}", "invalid_type")
    if not math.isfinite(v) or not lo <= v <= hi:
        raise bad_request(name, f"must be in [{lo:g}, {hi:g}], got {v!r}", "invalid_value")
    return int(v) if integer else float(v)


def parse_speech(body: Any) -> SpeechRequest:
    """Validate a ``/v1/audio/speech`` JSON body. Raises ApiError(400) naming the field."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    unknown = sorted(set(body) - set(SPEECH_FIELDS))
    if unknown:
        raise bad_request(unknown[0], "unknown field; known fields: " + ", ".join(SPEECH_FIELDS), "unknown_field")
    model = _str(body, "model") or ""
    text = _str(body, "input", required=True)
    voice = body.get("voice")
    if isinstance(voice, Mapping) and set(voice) == {"id"}:  # OpenAI's custom-voice object {"id": ...}
        voice = voice["id"]
    if voice is not None and (not isinstance(voice, str) or not voice.strip()):
        raise bad_request("voice", "must be a non-empty string (a preset speaker or a stored voice id)")
    formats = supported_formats()
    fmt = _str(body, "response_format") or "mp3"
    if fmt not in formats:
        raise bad_request(
            "response_format",
            f"{fmt!r} is not supported here; allowed values: {', '.join(formats)}",
            "unsupported_value",
        )
    speed = _number(body, "speed", False, -math.inf, math.inf)
    if speed is not None and speed != 1.0:
        raise bad_request("speed", f"only 1.0 is supported (the model has no speed control), got {speed:g}")
    sf = _str(body, "stream_format") or "audio"
    if sf not in STREAM_FORMATS:
        raise bad_request("stream_format", f"{sf!r} is not allowed; allowed values: {', '.join(STREAM_FORMATS)}")
    rate = _number(body, "sample_rate", True, MIN_RATE, MAX_RATE)
    rate = MODEL_RATE if rate is None else rate
    rates = allowed_rates(fmt)
    if rates is not None and rate not in rates:
        raise bad_request(
            "sample_rate",
            f"{rate} Hz cannot be encoded as {fmt}; allowed: {', '.join(str(r) for r in rates)}",
        )
    sampling = {
        "temperature": _number(body, "temperature", False, 0.0, 100.0),
        "top_k": _number(body, "top_k", True, 1, 2**31 - 1),
        "top_p": _number(body, "top_p", False, 0.0, 1.0),
        "repetition_penalty": _number(body, "repetition_penalty", False, 0.0, 100.0),
        "subtalker_temperature": _number(body, "subtalker_temperature", False, 0.0, 100.0),
        "subtalker_top_k": _number(body, "subtalker_top_k", True, 1, 2**31 - 1),
        "subtalker_top_p": _number(body, "subtalker_top_p", False, 0.0, 1.0),
        "seed": _number(body, "seed", True, 0, 2**63 - 1),
        "max_frames": _number(body, "max_frames", True, 1, 2**31 - 1),
    }
    instructions = _str(body, "instructions")
    return SpeechRequest(
        model=model,
        input=text,
        voice=voice.strip() if isinstance(voice, str) else None,
        response_format=fmt,
        stream_format=sf,
        sample_rate=rate,
        instructions=instructions if instructions and instructions.strip() else None,
        language=_str(body, "language"),
        speaker=_str(body, "speaker"),
        sampling={k: v for k, v in sampling.items() if v is not None},
    )


def tts_inputs(req: SpeechRequest, voice: Optional["StoredVoiceRef"] = None, presets: bool = True) -> Dict[str, Any]:
    """The `tts` inputs (name -> Python value or float32 array) for ``req``. ``voice``: the stored
    voice ``req.voice`` names (Base cloning: the reference audio, its rate and transcript are sent
    with a content-derived ``voice_id``, so the tts's voice cache answers repeats without running
    the encoders); None: ``voice`` (or ``speaker``) is a preset speaker, unless ``presets`` is
    false (a VoiceDesign checkpoint: ``instructions`` describe the voice, ``voice`` is ignored)."""
    out: Dict[str, Any] = {"text": req.input, "stream": True, "sample_format": "float32"}
    if voice is not None:
        out.update(
            task_type="Base",
            ref_audio=voice.audio,
            ref_sample_rate=voice.sample_rate,
            voice_id=voice.cache_id,
        )
        if voice.ref_text:
            out["ref_text"] = voice.ref_text
        else:
            out["x_vector_only"] = True
    elif presets:
        speaker = req.speaker or req.voice
        if speaker:
            out["speaker"] = speaker
    if req.instructions:
        out["instruct"] = req.instructions
    if req.language:
        out["language"] = req.language
    out.update(req.sampling)
    return out


class StoredVoiceRef:  # the attributes tts_inputs reads (voices.StoredVoice has them)
    audio: Any
    sample_rate: int
    ref_text: Optional[str]
    cache_id: str
