"""Validation of `tts` model requests (pure: numpy only; no Triton, no torch).

The Triton adapter hands us each input as a numpy array (or ``None`` when absent). Every check
raises :class:`RequestError` naming the input and the allowed values; the adapter turns it into a
Triton ``INVALID_ARG`` error. Nothing here touches the engine, so a bad request can never disturb
the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from triton_qwen3_tts.model.config import GenerationDefaults
from triton_qwen3_tts.serving.settings import default

__all__ = [
    "RequestError",
    "Sampling",
    "SAMPLING_INPUTS",
    "TtsLimits",
    "TtsRequest",
    "check_sampling",
    "parse_tts_request",
    "TTS_INPUTS",
    "SAMPLE_FORMATS",
    "TASK_TYPES",
]

TASK_TYPES = ("CustomVoice", "VoiceDesign", "Base")
SAMPLE_FORMATS = ("float32", "int16")
MAX_VOICE_ID_CHARS = 256
OUTPUT_RATES = (8000, 48000)  # the sample_rate input's range (the model's own rate is 24000)


class RequestError(ValueError):
    """A request input is invalid. ``field`` names the input."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


_GEN = GenerationDefaults()

# The official generation controls (generation_config.json names), tts and talker inputs alike.
SAMPLING_INPUTS = (
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "subtalker_temperature",
    "subtalker_top_k",
    "subtalker_top_p",
)
# A subtalker_* input the request leaves out follows the request's own talker value when it gives
# one (one temperature still drives both stages, and temperature 0 is greedy throughout).
_FOLLOWS = {"subtalker_temperature": "temperature", "subtalker_top_k": "top_k", "subtalker_top_p": "top_p"}


@dataclass(frozen=True)
class Sampling:
    """A request's sampling, resolved and checked: codebook 0 (the talker) and the residual
    codebooks (the code predictor, ``subtalker_*``). A temperature of 0 means greedy (argmax) for
    its stage, the official ``do_sample`` / ``subtalker_dosample`` = False."""

    temperature: float = _GEN.temperature
    top_k: int = _GEN.top_k
    top_p: float = _GEN.top_p
    repetition_penalty: float = _GEN.repetition_penalty
    subtalker_temperature: float = _GEN.subtalker_temperature
    subtalker_top_k: int = _GEN.subtalker_top_k
    subtalker_top_p: float = _GEN.subtalker_top_p

    @classmethod
    def from_generation(cls, g: GenerationDefaults) -> "Sampling":
        """The defaults of a checkpoint's ``generation_config.json`` (``do_sample`` False: greedy)."""
        return cls(
            temperature=g.temperature if g.do_sample else 0.0,
            top_k=g.top_k,
            top_p=g.top_p,
            repetition_penalty=g.repetition_penalty,
            subtalker_temperature=g.subtalker_temperature if g.subtalker_dosample else 0.0,
            subtalker_top_k=g.subtalker_top_k,
            subtalker_top_p=g.subtalker_top_p,
        )


def check_sampling(
    given: Mapping[str, Any], defaults: Sampling = Sampling(), max_top_k: int = 2048, max_subtalker_top_k: int = 2048
) -> Sampling:
    """The sampling inputs of a request (the tts's and the talker's): ``given`` maps each name of
    :data:`SAMPLING_INPUTS` to its value, or None when the request leaves it out (then
    ``defaults``; a left-out ``subtalker_*`` follows its talker input when that one is given).
    Raises :class:`RequestError` naming the input and its allowed range."""
    v = {}
    for name in SAMPLING_INPUTS:
        x = given.get(name)
        if x is None and name in _FOLLOWS:
            x = given.get(_FOLLOWS[name])
        v[name] = getattr(defaults, name) if x is None else x
    for name in ("temperature", "subtalker_temperature"):
        if not math.isfinite(v[name]) or v[name] < 0:
            raise RequestError(name, f"must be a finite number >= 0 (0 = greedy), got {v[name]}")
    for name, hi in (("top_k", max_top_k), ("subtalker_top_k", max_subtalker_top_k)):
        if not 1 <= v[name] <= hi:
            raise RequestError(name, f"must be an integer in [1, {hi}], got {v[name]}")
    for name in ("top_p", "subtalker_top_p"):
        if not 0 < v[name] <= 1:  # NaN fails too
            raise RequestError(name, f"must be in (0, 1] (1 = off), got {v[name]}")
    rp = v["repetition_penalty"]
    if not (math.isfinite(rp) and rp > 0):
        raise RequestError("repetition_penalty", f"must be a finite number > 0 (1 = off), got {rp}")
    return Sampling(**v)


# name -> (Triton dtype, kind) ; kind: str | bool | int | float | audio
TTS_INPUTS = {
    "text": ("BYTES", "str"),
    "task_type": ("BYTES", "str"),
    "speaker": ("BYTES", "str"),
    "language": ("BYTES", "str"),
    "instruct": ("BYTES", "str"),
    "ref_audio": ("FP32", "audio"),
    "ref_sample_rate": ("INT32", "int"),
    "ref_text": ("BYTES", "str"),
    "x_vector_only": ("BOOL", "bool"),
    "voice_id": ("BYTES", "str"),
    "replace_voice": ("BOOL", "bool"),
    "sample_format": ("BYTES", "str"),
    "sample_rate": ("INT32", "int"),
    "stream": ("BOOL", "bool"),
    "temperature": ("FP32", "float"),
    "top_k": ("INT32", "int"),
    "top_p": ("FP32", "float"),
    "repetition_penalty": ("FP32", "float"),
    "subtalker_temperature": ("FP32", "float"),
    "subtalker_top_k": ("INT32", "int"),
    "subtalker_top_p": ("FP32", "float"),
    "seed": ("INT64", "int"),
    "max_frames": ("INT32", "int"),
    "ignore_eos": ("BOOL", "bool"),
}


@dataclass(frozen=True)
class TtsLimits:
    """Server-side defaults and limits (from the `tts` model's config.pbtxt parameters)."""

    default_task_type: str = "CustomVoice"
    default_speaker: Optional[str] = None
    default_language: str = "auto"
    default_sample_format: str = "float32"
    default_stream: bool = True
    default_temperature: float = GenerationDefaults.temperature
    default_top_k: int = GenerationDefaults.top_k
    default_top_p: float = GenerationDefaults.top_p
    default_repetition_penalty: float = GenerationDefaults.repetition_penalty
    default_subtalker_temperature: float = GenerationDefaults.subtalker_temperature
    default_subtalker_top_k: int = GenerationDefaults.subtalker_top_k
    default_subtalker_top_p: float = GenerationDefaults.subtalker_top_p
    default_max_frames: int = default("default_max_frames")
    max_frames_limit: int = default("max_frames_limit")
    max_text_chars: int = default("max_text_chars")
    max_instruct_chars: int = default("max_instruct_chars")
    ref_min_seconds: float = 1.0
    ref_max_seconds: float = 30.0
    ref_sample_rates: tuple = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)
    max_top_k: int = 2048  # codebook 0's real codes (the talker engine may allow fewer)
    max_subtalker_top_k: int = 2048  # a residual codebook's size

    def __post_init__(self):
        if self.default_task_type not in TASK_TYPES:
            raise ValueError(f"default_task_type must be one of {TASK_TYPES}")
        if self.default_sample_format not in SAMPLE_FORMATS:
            raise ValueError(f"default_sample_format must be one of {SAMPLE_FORMATS}")
        if not (1 <= self.default_max_frames <= self.max_frames_limit):
            raise ValueError("default_max_frames must be in [1, max_frames_limit]")
        if not (0 < self.ref_min_seconds < self.ref_max_seconds):
            raise ValueError("need 0 < ref_min_seconds < ref_max_seconds")
        if self.max_text_chars < 1:
            raise ValueError("max_text_chars must be >= 1")
        try:
            check_sampling({}, self.sampling_defaults, self.max_top_k, self.max_subtalker_top_k)
        except RequestError as e:
            raise ValueError(f"default_{e}") from None

    @property
    def sampling_defaults(self) -> Sampling:
        return Sampling(
            temperature=self.default_temperature,
            top_k=self.default_top_k,
            top_p=self.default_top_p,
            repetition_penalty=self.default_repetition_penalty,
            subtalker_temperature=self.default_subtalker_temperature,
            subtalker_top_k=self.default_subtalker_top_k,
            subtalker_top_p=self.default_subtalker_top_p,
        )


@dataclass(frozen=True)
class TtsRequest:
    """A validated request. Model-specific checks (speaker and language names, task type served by
    the checkpoint) happen in the prompt builder, which knows the checkpoint's config."""

    text: str
    task_type: str
    speaker: Optional[str]
    language: str
    instruct: Optional[str]
    ref_audio: Optional[np.ndarray]  # float32 mono, at ref_sample_rate
    ref_sample_rate: Optional[int]
    ref_text: Optional[str]
    # None when the client did not say: in-context with ref_audio, the stored mode with voice_id only
    x_vector_only: Optional[bool]
    voice_id: Optional[str]
    sample_format: str
    stream: bool
    sampling: Sampling
    seed: Optional[int]
    max_frames: int
    ignore_eos: bool
    # with ref_audio and voice_id: replace a cached voice of this id stored from other audio
    replace_voice: bool = False
    # the output's rate: the model's 24 kHz audio is resampled to it (soxr) when it differs
    sample_rate: int = 24000

    def with_(self, **kw) -> "TtsRequest":
        return replace(self, **kw)


def _scalar(name: str, arr: Any, kind: str):
    """Return the single element of a [1] or [1, 1] input, checked for type."""
    if arr is None:
        return None
    a = np.asarray(arr)
    if a.size != 1 or a.ndim > 2:
        raise RequestError(name, f"expected a single value of shape [1] (or [1, 1]), got shape {list(a.shape)}")
    v = a.reshape(-1)[0]
    if kind == "str":
        if isinstance(v, (bytes, np.bytes_)):
            try:
                return bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(name, f"is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        if isinstance(v, str):
            return v
        raise RequestError(name, f"expected a UTF-8 string (BYTES), got {a.dtype}")
    if kind == "bool":
        if a.dtype != np.bool_:
            raise RequestError(name, f"expected BOOL, got {a.dtype}")
        return bool(v)
    if kind == "int":
        if not np.issubdtype(a.dtype, np.integer):
            raise RequestError(name, f"expected an integer tensor, got {a.dtype}")
        return int(v)
    if kind == "float":
        if not np.issubdtype(a.dtype, np.floating):
            raise RequestError(name, f"expected a float tensor, got {a.dtype}")
        return float(v)
    raise AssertionError(kind)


def _choice(
    name: str, value: Optional[str], allowed: Sequence[str], default: Optional[str], case_insensitive: bool = True
) -> Optional[str]:
    if value is None or value.strip() == "":
        return default
    v = value.strip()
    for a in allowed:
        if (v.lower() == a.lower()) if case_insensitive else (v == a):
            return a
    raise RequestError(name, f"{value!r} is not allowed; allowed values: {', '.join(allowed)}")


def _text(name: str, value: Optional[str], max_chars: int, required: bool) -> Optional[str]:
    if value is None:
        if required:
            raise RequestError(name, "is required")
        return None
    if "\x00" in value:
        raise RequestError(name, "contains a NUL character")
    if value.strip() == "":
        if required:
            raise RequestError(name, "is empty or whitespace only")
        return None
    if len(value) > max_chars:
        raise RequestError(name, f"has {len(value)} characters; the limit is {max_chars}")
    return value


def _audio(arr: Any) -> Optional[np.ndarray]:
    if arr is None:
        return None
    a = np.asarray(arr)
    if a.dtype not in (np.float32, np.float64):
        raise RequestError("ref_audio", f"expected FP32 samples in [-1, 1], got {a.dtype}")
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise RequestError("ref_audio", f"expected mono audio of shape [samples] or [1, samples], got {list(a.shape)}")
    if not np.all(np.isfinite(a)):
        raise RequestError("ref_audio", "contains NaN or Inf")
    return a.astype(np.float32, copy=False)


def parse_tts_request(inputs: Mapping[str, Any], limits: TtsLimits) -> TtsRequest:
    """Validate raw inputs (name -> numpy array or None) against ``limits``."""
    unknown = set(inputs) - set(TTS_INPUTS)
    if unknown:
        raise RequestError(sorted(unknown)[0], f"unknown input; known inputs: {', '.join(TTS_INPUTS)}")
    v = {name: _scalar(name, inputs.get(name), kind) for name, (_, kind) in TTS_INPUTS.items() if kind != "audio"}

    text = _text("text", v["text"], limits.max_text_chars, required=True)
    task = _choice("task_type", v["task_type"], TASK_TYPES, limits.default_task_type)
    speaker = v["speaker"].strip().lower() if v["speaker"] and v["speaker"].strip() else limits.default_speaker
    language = v["language"].strip().lower() if v["language"] and v["language"].strip() else limits.default_language
    instruct = _text("instruct", v["instruct"], limits.max_instruct_chars, required=False)
    sample_format = _choice("sample_format", v["sample_format"], SAMPLE_FORMATS, limits.default_sample_format)
    stream = limits.default_stream if v["stream"] is None else v["stream"]
    sample_rate = 24000 if v["sample_rate"] is None else v["sample_rate"]
    if not OUTPUT_RATES[0] <= sample_rate <= OUTPUT_RATES[1]:
        raise RequestError(
            "sample_rate", f"must be in [{OUTPUT_RATES[0]}, {OUTPUT_RATES[1]}] Hz (default 24000), got {sample_rate}"
        )

    sampling = check_sampling(
        {name: v[name] for name in SAMPLING_INPUTS},
        limits.sampling_defaults,
        limits.max_top_k,
        limits.max_subtalker_top_k,
    )
    seed = v["seed"]
    if seed is not None and not (0 <= seed < 2**63):
        raise RequestError("seed", f"must be in [0, 2^63), got {seed}")
    max_frames = limits.default_max_frames if v["max_frames"] is None else v["max_frames"]
    if not (1 <= max_frames <= limits.max_frames_limit):
        raise RequestError("max_frames", f"must be in [1, {limits.max_frames_limit}], got {max_frames}")

    ref_audio = _audio(inputs.get("ref_audio"))
    ref_sr = v["ref_sample_rate"]
    ref_text = _text("ref_text", v["ref_text"], limits.max_text_chars, required=False)
    voice_id = v["voice_id"].strip() if v["voice_id"] and v["voice_id"].strip() else None
    if voice_id is not None and (len(voice_id) > MAX_VOICE_ID_CHARS or not voice_id.isprintable()):
        raise RequestError(
            "voice_id", f"must be at most {MAX_VOICE_ID_CHARS} printable characters (got {len(voice_id)} characters)"
        )
    x_vector_only = v["x_vector_only"]
    if ref_audio is not None:
        if ref_sr is None:
            raise RequestError("ref_sample_rate", "is required with ref_audio")
        if ref_sr not in limits.ref_sample_rates:
            raise RequestError(
                "ref_sample_rate",
                f"{ref_sr} Hz is not supported; allowed: " + ", ".join(str(s) for s in limits.ref_sample_rates),
            )
        secs = ref_audio.shape[0] / ref_sr
        if secs < limits.ref_min_seconds:
            raise RequestError("ref_audio", f"is {secs:.2f} s long; at least {limits.ref_min_seconds} s is needed")
        if secs > limits.ref_max_seconds:
            raise RequestError("ref_audio", f"is {secs:.2f} s long; at most {limits.ref_max_seconds} s is allowed")
        if float(np.sqrt(np.mean(np.square(ref_audio, dtype=np.float64)))) < 1e-4:
            raise RequestError("ref_audio", "is silence (RMS below 1e-4)")
        if float(np.max(np.abs(ref_audio))) > 1.0 + 1e-6:
            raise RequestError("ref_audio", "samples must lie in [-1, 1]")
    elif ref_sr is not None:
        raise RequestError("ref_sample_rate", "given without ref_audio")

    if task == "VoiceDesign" and instruct is None:
        raise RequestError("instruct", "is required for task_type VoiceDesign (describe the voice)")
    if task == "Base":
        if v["replace_voice"] and (ref_audio is None or voice_id is None):
            raise RequestError("replace_voice", "needs ref_audio and voice_id (the voice to store under that id)")
        if ref_audio is None and voice_id is None:
            raise RequestError(
                "ref_audio", "task_type Base needs ref_audio (with ref_sample_rate) or a cached voice_id"
            )
        if ref_audio is not None and not x_vector_only and ref_text is None:
            raise RequestError(
                "ref_text",
                "is required for in-context cloning; set x_vector_only=true to clone from the speaker embedding alone",
            )
        if ref_audio is None and ref_text is not None:
            raise RequestError(
                "ref_text",
                "is given without ref_audio; a cached voice_id carries the transcript "
                "stored with it (send ref_audio, ref_sample_rate and ref_text to replace it)",
            )
    else:
        for name, val in (
            ("ref_audio", ref_audio),
            ("ref_text", ref_text),
            ("voice_id", voice_id),
            ("x_vector_only", x_vector_only),
            ("replace_voice", v["replace_voice"]),
        ):
            if val is not None:
                raise RequestError(name, f"is only used with task_type Base, not {task}")

    return TtsRequest(
        text=text,
        task_type=task,
        speaker=speaker,
        language=language,
        instruct=instruct,
        ref_audio=ref_audio,
        ref_sample_rate=ref_sr,
        ref_text=ref_text,
        x_vector_only=x_vector_only,
        voice_id=voice_id,
        sample_format=sample_format,
        stream=stream,
        sampling=sampling,
        seed=seed,
        max_frames=max_frames,
        ignore_eos=bool(v["ignore_eos"] or False),
        replace_voice=bool(v["replace_voice"] or False),
        sample_rate=sample_rate,
    )
