"""The tensors of the official checkpoint files, enumerated from the reference modules.

Every tensor of ``model.safetensors`` and ``speech_tokenizer/model.safetensors`` (key, shape,
dtype) comes from building the reference module on the meta device: the loader
(:mod:`triton_qwen3_tts.model.checkpoint`) validates a checkpoint against this enumeration, and the
random-checkpoint writer (:mod:`triton_qwen3_tts.tools.random_checkpoint`) writes exactly it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from triton_qwen3_tts.model.config import Qwen3TTSConfig, SpeechTokenizerConfig

__all__ = [
    "TensorSpec",
    "MAIN_DTYPE",
    "SPEECH_TOKENIZER_DTYPE",
    "build_main_model",
    "build_codec_decoder",
    "build_codec_encoder",
    "module_tensor_specs",
    "main_tensor_specs",
    "speech_tokenizer_tensor_specs",
    "count_params",
]

MAIN_DTYPE = torch.bfloat16  # the main checkpoint (model.safetensors) is bf16
SPEECH_TOKENIZER_DTYPE = torch.float32  # speech_tokenizer/model.safetensors is fp32


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a checkpoint file: its key, shape and the dtype it is stored in."""

    key: str
    shape: tuple
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


# ----------------------------------------------------------------------------------------------
# Module builders (lazy imports: the modules are owned by other files and may be absent).


def _import(module: str):
    return importlib.import_module(f"{__package__}.{module}")


def _first_attr(mod, names: Sequence[str]) -> Callable:
    for n in names:
        fn = getattr(mod, n, None)
        if fn is not None:
            return fn
    raise ImportError(f"{mod.__name__} defines none of {', '.join(names)}")


def build_main_model(config: Qwen3TTSConfig) -> nn.Module:
    """``talker.Qwen3TTSModel(config)`` on the current default device (use ``torch.device``)."""
    return _import("talker").Qwen3TTSModel(config)


def build_codec_decoder(st_config: SpeechTokenizerConfig) -> nn.Module:
    """``codec.CodecDecoder(decoder_config)``; its keys are ``decoder.*`` minus the prefix."""
    return _import("codec").CodecDecoder(st_config.decoder)


def build_codec_encoder(st_config: SpeechTokenizerConfig) -> nn.Module:
    """The Mimi-based encoder of ``codec_encoder``; its keys are ``encoder.*`` minus the prefix."""
    mod = _import("codec_encoder")
    fn = _first_attr(mod, ("build_codec_encoder", "build_encoder", "build_speech_tokenizer_encoder", "CodecEncoder"))
    return fn(st_config)


def module_tensor_specs(module: nn.Module, prefix: str = "", dtype: Optional[torch.dtype] = None) -> list[TensorSpec]:
    """(key, shape, dtype) of every ``state_dict`` entry, floating tensors stored as ``dtype``."""
    out = []
    for key, t in module.state_dict().items():
        dt = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        out.append(TensorSpec(prefix + key, tuple(int(s) for s in t.shape), dt))
    return out


def main_tensor_specs(config: Qwen3TTSConfig, dtype: torch.dtype = MAIN_DTYPE) -> list[TensorSpec]:
    """Every tensor of ``model.safetensors`` for this config (module built on the meta device)."""
    with torch.device("meta"):
        model = build_main_model(config)
    return module_tensor_specs(model, "", dtype)


def speech_tokenizer_tensor_specs(
    st_config: SpeechTokenizerConfig,
    *,
    decoder: bool = True,
    encoder: bool = True,
    dtype: torch.dtype = SPEECH_TOKENIZER_DTYPE,
) -> list[TensorSpec]:
    """Every tensor of ``speech_tokenizer/model.safetensors`` (``decoder.*`` then ``encoder.*``)."""
    specs: list[TensorSpec] = []
    with torch.device("meta"):
        if decoder:
            specs += module_tensor_specs(build_codec_decoder(st_config), "decoder.", dtype)
        if encoder:
            specs += module_tensor_specs(build_codec_encoder(st_config), "encoder.", dtype)
    return specs


def count_params(specs: Iterable[TensorSpec]) -> tuple[int, int]:
    """(number of tensors, number of elements)."""
    specs = list(specs)
    return len(specs), sum(s.numel for s in specs)
