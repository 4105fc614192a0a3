"""Typed configs parsed from the official Qwen3-TTS 12 Hz checkpoint files.

Field names and defaults follow the official config classes (https://github.com/QwenLM/Qwen3-TTS)
and the released ``config.json`` files
(e.g. https://huggingface.co/Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice). The official ``config.json``
carries a few keys that are *not* named arguments of the official config classes and so only
reach the model as extra JSON attributes (``talker_config.text_vocab_size``,
``talker_config.head_dim``, the tokenizer decoder's ``codebook_dim`` and ``head_dim``). We read
every field explicitly so that none of them is silently replaced by a default.

Imports neither vLLM nor Triton; pure Python.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

__all__ = [
    "ConfigError",
    "CodePredictorConfig",
    "TalkerConfig",
    "SpeakerEncoderConfig",
    "Qwen3TTSConfig",
    "CodecDecoderConfig",
    "SpeechTokenizerConfig",
    "GenerationDefaults",
    "TASK_TYPES",
    "MODEL_TYPE_TO_TASK",
]


class ConfigError(ValueError):
    """A checkpoint config is missing a key or holds a value we cannot serve."""


# tts_model_type in config.json -> the task name used by the service API.
MODEL_TYPE_TO_TASK = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
TASK_TYPES = tuple(MODEL_TYPE_TO_TASK.values())


def _get(d: Mapping[str, Any], key: str, where: str, default: Any = ...):
    if key in d and d[key] is not None:
        return d[key]
    if default is ...:
        raise ConfigError(f"{where}: missing required key '{key}'")
    return default


def _to_dict(obj) -> dict:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if hasattr(v, "__dataclass_fields__"):
            v = _to_dict(v)
        out[f.name] = v
    return out


@dataclass(frozen=True)
class CodePredictorConfig:
    """``talker_config.code_predictor_config``: the same for both model sizes."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    num_code_groups: int
    max_position_embeddings: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CodePredictorConfig":
        w = "talker_config.code_predictor_config"
        hidden = int(_get(d, "hidden_size", w))
        heads = int(_get(d, "num_attention_heads", w))
        return cls(
            hidden_size=hidden,
            intermediate_size=int(_get(d, "intermediate_size", w)),
            num_hidden_layers=int(_get(d, "num_hidden_layers", w)),
            num_attention_heads=heads,
            num_key_value_heads=int(_get(d, "num_key_value_heads", w)),
            head_dim=int(_get(d, "head_dim", w, hidden // heads)),
            rms_norm_eps=float(_get(d, "rms_norm_eps", w, 1e-6)),
            rope_theta=float(_get(d, "rope_theta", w, 1e6)),
            vocab_size=int(_get(d, "vocab_size", w)),
            num_code_groups=int(_get(d, "num_code_groups", w)),
            max_position_embeddings=int(_get(d, "max_position_embeddings", w, 65536)),
        )


@dataclass(frozen=True)
class TalkerConfig:
    """``talker_config``: dimensions, RoPE and the codec / language / speaker ids."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int  # codec vocab: 2048 codes + specials = 3072
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_token_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_language_id: Mapping[str, int]
    spk_id: Mapping[str, int]
    # speaker -> dialect language name, or None for non-dialect speakers
    spk_is_dialect: Mapping[str, Optional[str]]
    code_predictor: CodePredictorConfig

    @property
    def codebook_size(self) -> int:
        return self.code_predictor.vocab_size

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TalkerConfig":
        w = "talker_config"
        hidden = int(_get(d, "hidden_size", w))
        heads = int(_get(d, "num_attention_heads", w))
        spk_raw = dict(_get(d, "spk_id", w, {}))
        spk_id = {}
        for name, v in spk_raw.items():
            # S1 accepts plain ints and single-element lists.
            if isinstance(v, (list, tuple)):
                if len(v) != 1:
                    raise ConfigError(f"{w}.spk_id['{name}']: expected an int or [int], got {v!r}")
                v = v[0]
            spk_id[name.lower()] = int(v)
        dialect = {}
        for name, v in dict(_get(d, "spk_is_dialect", w, {})).items():
            dialect[name.lower()] = v if isinstance(v, str) and v else None
        for name in spk_id:
            if name not in dialect:
                raise ConfigError(f"{w}.spk_is_dialect has no entry for speaker '{name}' (every speaker needs one)")
        langs = {k.lower(): int(v) for k, v in dict(_get(d, "codec_language_id", w)).items()}
        for name, dia in dialect.items():
            if dia is not None and dia not in langs:
                raise ConfigError(f"{w}.spk_is_dialect['{name}'] = '{dia}' is not in codec_language_id")
        rope_scaling = d.get("rope_scaling")
        if rope_scaling is not None:
            # S1 reads both keys unconditionally; the values are irrelevant because with three
            # identical position streams the interleaved M-RoPE equals plain 1-D RoPE bit for bit.
            for key in ("interleaved", "mrope_section"):
                if key not in rope_scaling:
                    raise ConfigError(f"{w}.rope_scaling: missing key '{key}'")
        cfg = cls(
            hidden_size=hidden,
            intermediate_size=int(_get(d, "intermediate_size", w)),
            num_hidden_layers=int(_get(d, "num_hidden_layers", w)),
            num_attention_heads=heads,
            num_key_value_heads=int(_get(d, "num_key_value_heads", w)),
            # Not a named argument of the official class: read it or get hidden/heads (wrong).
            head_dim=int(_get(d, "head_dim", w)),
            rms_norm_eps=float(_get(d, "rms_norm_eps", w, 1e-6)),
            rope_theta=float(_get(d, "rope_theta", w, 1e6)),
            max_position_embeddings=int(_get(d, "max_position_embeddings", w, 32768)),
            vocab_size=int(_get(d, "vocab_size", w)),
            # Not a named argument of the official class either.
            text_vocab_size=int(_get(d, "text_vocab_size", w)),
            text_hidden_size=int(_get(d, "text_hidden_size", w)),
            num_code_groups=int(_get(d, "num_code_groups", w)),
            codec_pad_id=int(_get(d, "codec_pad_id", w)),
            codec_bos_id=int(_get(d, "codec_bos_id", w)),
            codec_eos_token_id=int(_get(d, "codec_eos_token_id", w)),
            codec_think_id=int(_get(d, "codec_think_id", w)),
            codec_nothink_id=int(_get(d, "codec_nothink_id", w)),
            codec_think_bos_id=int(_get(d, "codec_think_bos_id", w)),
            codec_think_eos_id=int(_get(d, "codec_think_eos_id", w)),
            codec_language_id=langs,
            spk_id=spk_id,
            spk_is_dialect=dialect,
            code_predictor=CodePredictorConfig.from_dict(_get(d, "code_predictor_config", w)),
        )
        if cfg.num_code_groups != cfg.code_predictor.num_code_groups:
            raise ConfigError(f"{w}: num_code_groups differs from the code predictor's")
        if d.get("use_sliding_window"):
            raise ConfigError(f"{w}: use_sliding_window=true is not supported (the talker is full causal)")
        return cfg

    def to_dict(self) -> dict:
        return _to_dict(self)


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """``speaker_encoder_config`` (ECAPA-TDNN); present for Base models only."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple = (5, 3, 3, 3, 1)
    enc_dilations: tuple = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SpeakerEncoderConfig":
        kw = {}
        for f in fields(cls):
            if f.name in d and d[f.name] is not None:
                v = d[f.name]
                kw[f.name] = tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else type(f.default)(v)
        return cls(**kw)


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """Top-level ``config.json`` of a Qwen3-TTS 12 Hz checkpoint."""

    tts_model_size: str  # "0b6" | "1b7"
    tts_model_type: str  # "base" | "custom_voice" | "voice_design"
    im_start_token_id: int
    im_end_token_id: int
    assistant_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    talker: TalkerConfig
    speaker_encoder: Optional[SpeakerEncoderConfig]

    @property
    def task_type(self) -> str:
        return MODEL_TYPE_TO_TASK[self.tts_model_type]

    @property
    def supported_languages(self) -> list:
        """ "auto" plus every language id that is not a dialect (``codec_language_id``)."""
        return ["auto"] + sorted(k for k in self.talker.codec_language_id if "dialect" not in k)

    @property
    def speakers(self) -> list:
        return sorted(self.talker.spk_id)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Qwen3TTSConfig":
        w = "config.json"
        mt = d.get("model_type")
        if mt != "qwen3_tts":
            raise ConfigError(f"{w}: model_type is {mt!r}, expected 'qwen3_tts'")
        tt = d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")
        if tt != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"{w}: tokenizer_type {tt!r} is not supported (only the 12 Hz tokenizer)")
        model_type = str(_get(d, "tts_model_type", w))
        if model_type not in MODEL_TYPE_TO_TASK:
            raise ConfigError(f"{w}: tts_model_type {model_type!r}; expected one of {sorted(MODEL_TYPE_TO_TASK)}")
        talker = TalkerConfig.from_dict(_get(d, "talker_config", w))
        spk = None
        if model_type == "base":
            spk = SpeakerEncoderConfig.from_dict(d.get("speaker_encoder_config") or {})
            if spk.enc_dim != talker.hidden_size:
                raise ConfigError(
                    f"{w}: speaker_encoder_config.enc_dim={spk.enc_dim} must equal the talker "
                    f"hidden_size={talker.hidden_size} (the x-vector is a prompt row)"
                )
        return cls(
            tts_model_size=str(_get(d, "tts_model_size", w)),
            tts_model_type=model_type,
            im_start_token_id=int(_get(d, "im_start_token_id", w)),
            im_end_token_id=int(_get(d, "im_end_token_id", w)),
            assistant_token_id=int(_get(d, "assistant_token_id", w, 77091)),
            tts_pad_token_id=int(_get(d, "tts_pad_token_id", w)),
            tts_bos_token_id=int(_get(d, "tts_bos_token_id", w)),
            tts_eos_token_id=int(_get(d, "tts_eos_token_id", w)),
            talker=talker,
            speaker_encoder=spk,
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Qwen3TTSConfig":
        return cls.from_dict(_read_json(path))


@dataclass(frozen=True)
class CodecDecoderConfig:
    """``speech_tokenizer/config.json`` -> ``decoder_config``."""

    codebook_size: int
    codebook_dim: int  # extra JSON key; per-codebook vector width is codebook_dim // 2
    num_quantizers: int
    num_semantic_quantizers: int
    latent_dim: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # extra JSON key
    sliding_window: int
    rope_theta: float
    max_position_embeddings: int
    rms_norm_eps: float
    layer_scale_initial_scale: float
    decoder_dim: int
    upsampling_ratios: tuple
    upsample_rates: tuple

    @property
    def total_upsample(self) -> int:
        n = 1
        for r in tuple(self.upsampling_ratios) + tuple(self.upsample_rates):
            n *= int(r)
        return n

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CodecDecoderConfig":
        w = "speech_tokenizer/config.json decoder_config"
        hidden = int(_get(d, "hidden_size", w))
        heads = int(_get(d, "num_attention_heads", w))
        nsq = int(_get(d, "num_semantic_quantizers", w, 1))
        if nsq != 1:
            raise ConfigError(f"{w}: num_semantic_quantizers={nsq}; only 1 is supported")
        # semantic_codebook_size (4096) is present in the file but unused: the checkpoint's
        # semantic codebook has codebook_size rows like the others. Ignored on purpose.
        return cls(
            codebook_size=int(_get(d, "codebook_size", w)),
            codebook_dim=int(_get(d, "codebook_dim", w)),
            num_quantizers=int(_get(d, "num_quantizers", w)),
            num_semantic_quantizers=nsq,
            latent_dim=int(_get(d, "latent_dim", w)),
            hidden_size=hidden,
            intermediate_size=int(_get(d, "intermediate_size", w)),
            num_hidden_layers=int(_get(d, "num_hidden_layers", w)),
            num_attention_heads=heads,
            num_key_value_heads=int(_get(d, "num_key_value_heads", w, heads)),
            head_dim=int(_get(d, "head_dim", w)),
            sliding_window=int(_get(d, "sliding_window", w)),
            rope_theta=float(_get(d, "rope_theta", w, 10000.0)),
            max_position_embeddings=int(_get(d, "max_position_embeddings", w, 8000)),
            rms_norm_eps=float(_get(d, "rms_norm_eps", w, 1e-5)),
            layer_scale_initial_scale=float(_get(d, "layer_scale_initial_scale", w, 0.01)),
            decoder_dim=int(_get(d, "decoder_dim", w)),
            upsampling_ratios=tuple(int(x) for x in _get(d, "upsampling_ratios", w)),
            upsample_rates=tuple(int(x) for x in _get(d, "upsample_rates", w)),
        )


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    """``speech_tokenizer/config.json`` (the Qwen3-TTS-Tokenizer-12Hz codec)."""

    encoder_valid_num_quantizers: int
    input_sample_rate: int
    output_sample_rate: int
    encode_downsample_rate: int
    decode_upsample_rate: int
    decoder: CodecDecoderConfig
    encoder: Mapping[str, Any] = field(default_factory=dict)  # raw MimiConfig kwargs

    @property
    def samples_per_frame(self) -> int:
        return self.decode_upsample_rate

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SpeechTokenizerConfig":
        w = "speech_tokenizer/config.json"
        mt = d.get("model_type", "qwen3_tts_tokenizer_12hz")
        if mt != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"{w}: model_type {mt!r}, expected 'qwen3_tts_tokenizer_12hz'")
        cfg = cls(
            encoder_valid_num_quantizers=int(_get(d, "encoder_valid_num_quantizers", w, 16)),
            input_sample_rate=int(_get(d, "input_sample_rate", w, 24000)),
            output_sample_rate=int(_get(d, "output_sample_rate", w, 24000)),
            encode_downsample_rate=int(_get(d, "encode_downsample_rate", w, 1920)),
            decode_upsample_rate=int(_get(d, "decode_upsample_rate", w, 1920)),
            decoder=CodecDecoderConfig.from_dict(_get(d, "decoder_config", w)),
            encoder=dict(d.get("encoder_config") or {}),
        )
        if cfg.decoder.total_upsample != cfg.decode_upsample_rate:
            raise ConfigError(
                f"{w}: decoder upsampling {cfg.decoder.total_upsample} != decode_upsample_rate "
                f"{cfg.decode_upsample_rate}"
            )
        return cfg

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "SpeechTokenizerConfig":
        return cls.from_dict(_read_json(path))


@dataclass(frozen=True)
class GenerationDefaults:
    """``generation_config.json`` merged over the wrapper's hard-coded defaults (the same values,
    except ``max_new_tokens``: 8192 in the file, 2048 in the wrapper).

    ``min_new_tokens`` and the suppression of special codec ids are hard-coded in the official
    wrapper, not read from the file.
    """

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048  # wrapper fallback when the file has no max_new_tokens
    min_new_tokens: int = 2

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GenerationDefaults":
        kw = {}
        for f in fields(cls):
            if f.name in d and d[f.name] is not None:
                kw[f.name] = type(f.default)(d[f.name])
        return cls(**kw)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "GenerationDefaults":
        if not os.path.exists(path):
            return cls()
        return cls.from_dict(_read_json(path))


def _read_json(path) -> dict:
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"missing file: {path}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
