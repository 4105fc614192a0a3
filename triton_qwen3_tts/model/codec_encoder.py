"""Speech-tokenizer encoder: reference audio (24 kHz) -> codec codes ``[T, 16]`` for Base ICL.

Follows the official code (https://github.com/QwenLM/Qwen3-TTS). The official encoder
(``Qwen3TTSTokenizerV2Encoder``) is Hugging Face ``MimiModel`` with ``upsample``,
``decoder_transformer`` and ``decoder`` set to None; we do the same, so the state-dict keys are
exactly the checkpoint's ``encoder.*`` keys without the prefix:
``encoder.layers.*`` (SEANet), ``encoder_transformer.layers.*``, ``downsample.conv.weight`` and
``quantizer.{semantic,acoustic}_residual_vector_quantizer.{input_proj,output_proj,
layers.N.codebook.{initialized,cluster_usage,embed_sum}}``. The codebook tensors are buffers
(not parameters) but are in the state dict and the checkpoint: the real encoder has 225
tensors / 56,234,304 elements counting them.

Encoding one utterance (official ``Qwen3TTSTokenizer.encode`` → ``Qwen3TTSTokenizerV2Model
.encode``): the ``EncodecFeatureExtractor`` leaves a single item unpadded (float32, padding mask
all ones); Mimi encodes; the first ``encoder_valid_num_quantizers`` (16) codebooks are kept;
the codes are trimmed to ``ceil(samples / 1920)`` frames and transposed to ``[T, 16]``.
We ask Mimi for only 16 quantizers instead of 32 and slicing: residual quantization is
sequential, so the first 16 codes are identical (tested) and 16 RVQ steps are skipped.

Mimi's codebook caches ``embed_sum / cluster_usage`` in a plain attribute on first use; that
cache would go stale after ``load_state_dict`` or ``.to(device)``. :class:`CodecEncoder` clears
it on both. Imports neither vLLM nor Triton.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Union

import numpy as np
import torch
from transformers import MimiConfig, MimiModel

from triton_qwen3_tts.model.config import SpeechTokenizerConfig

__all__ = ["CodecEncoder", "build_codec_encoder", "encode_reference", "init_random_encoder_weights"]


class CodecEncoder(MimiModel):
    """``MimiModel`` without its decoder half (official ``Qwen3TTSTokenizerV2Encoder``).

    Extra attributes (not in the state dict): ``valid_num_quantizers`` (16) and
    ``downsample_rate`` (1920 samples per code frame).
    """

    def __init__(self, config: MimiConfig, valid_num_quantizers: int = 16, downsample_rate: int = 1920):
        super().__init__(config)
        self.upsample = None
        self.decoder_transformer = None
        self.decoder = None
        self.valid_num_quantizers = int(valid_num_quantizers)
        self.downsample_rate = int(downsample_rate)
        if not config.num_semantic_quantizers <= self.valid_num_quantizers <= config.num_quantizers:
            raise ValueError(
                f"valid_num_quantizers={valid_num_quantizers} must lie in "
                f"[{config.num_semantic_quantizers}, {config.num_quantizers}]"
            )
        self.register_load_state_dict_post_hook(lambda module, _keys: module.clear_codebook_cache())

    def clear_codebook_cache(self) -> None:
        """Forget every codebook's cached ``embed`` (recomputed from the buffers on next use)."""
        for m in self.modules():
            if hasattr(m, "_embed") and hasattr(m, "embed_sum"):
                m._embed = None

    def _apply(self, fn, *args, **kwargs):
        # .to()/.cuda()/.half() replace the buffers; the cached embed must follow them.
        out = super()._apply(fn, *args, **kwargs)
        self.clear_codebook_cache()
        return out

    @torch.no_grad()  # not inference_mode: Mimi caches the codebook, an inference tensor would leak
    def encode_codes(self, wav: torch.Tensor, num_quantizers: int) -> torch.Tensor:
        """Raw Mimi codes ``[B, num_quantizers, frames]`` of ``wav`` ``[B, samples]``."""
        return self.encode(wav.unsqueeze(1), num_quantizers=num_quantizers, return_dict=True).audio_codes


def build_codec_encoder(st_config: Union[SpeechTokenizerConfig, Mapping[str, Any]]) -> CodecEncoder:
    """The encoder for ``speech_tokenizer/config.json`` (a parsed config or the raw dict), in eval mode.

    Built on the current default device (use ``with torch.device("meta")`` for shapes only).
    """
    if not isinstance(st_config, SpeechTokenizerConfig):
        st_config = SpeechTokenizerConfig.from_dict(st_config)
    if not st_config.encoder:
        raise ValueError("speech_tokenizer/config.json has no encoder_config")
    enc = CodecEncoder(
        MimiConfig(**dict(st_config.encoder)),
        valid_num_quantizers=st_config.encoder_valid_num_quantizers,
        downsample_rate=st_config.encode_downsample_rate,
    )
    return enc.eval()


@torch.no_grad()
def encode_reference(
    encoder: CodecEncoder, wav_24k: Union[np.ndarray, torch.Tensor], valid_quantizers: int | None = None
) -> np.ndarray:
    """Codes ``[T, valid_quantizers]`` int64 of one mono 24 kHz waveform ``[samples]``.

    ``T = ceil(samples / 1920)``. ``valid_quantizers`` defaults to the encoder's
    ``valid_num_quantizers`` (16, ``encoder_valid_num_quantizers``).
    """
    nq = encoder.valid_num_quantizers if valid_quantizers is None else int(valid_quantizers)
    if not encoder.config.num_semantic_quantizers <= nq <= encoder.config.num_quantizers:
        raise ValueError(
            f"valid_quantizers={nq} outside [{encoder.config.num_semantic_quantizers}, {encoder.config.num_quantizers}]"
        )
    if isinstance(wav_24k, np.ndarray):
        wav = torch.from_numpy(np.ascontiguousarray(wav_24k, dtype=np.float32))
    elif isinstance(wav_24k, torch.Tensor):
        wav = wav_24k.detach().to(torch.float32)  # the feature extractor yields float32
    else:
        raise TypeError(f"expected a numpy array or torch tensor, got {type(wav_24k).__name__}")
    if wav.dim() != 1 or wav.shape[0] == 0:
        raise ValueError(f"expected a non-empty mono waveform [samples], got shape {tuple(wav.shape)}")
    p = next(encoder.parameters())
    codes = encoder.encode_codes(wav.to(device=p.device, dtype=p.dtype).unsqueeze(0), nq)[0]  # [nq, F]
    frames = math.ceil(wav.shape[0] / encoder.downsample_rate)
    if codes.shape[-1] < frames:
        raise RuntimeError(
            f"Mimi returned {codes.shape[-1]} frames for {wav.shape[0]} samples, expected at least {frames}"
        )
    return codes[:, :frames].transpose(0, 1).to(device="cpu", dtype=torch.int64).numpy()


def init_random_encoder_weights(encoder: CodecEncoder, seed: int) -> None:
    """Deterministic random weights for test checkpoints.

    Conv/linear weights ~ N(0, 1/fan_in), biases 0, LayerNorms (1, 0), layer scales 0.01 (the
    config's initial scale), codebooks ``embed_sum`` ~ N(0, 1) with ``cluster_usage = 1`` and
    ``initialized = 1`` so the codebook is ``embed_sum`` itself and codes spread over all entries.
    """
    g = torch.Generator().manual_seed(int(seed))
    scale = float(getattr(encoder.config, "layer_scale_initial_scale", 0.01))
    with torch.no_grad():
        for name, t in encoder.state_dict(keep_vars=True).items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "cluster_usage" or leaf == "initialized":
                t.fill_(1.0)
            elif leaf == "embed_sum":
                t.copy_(torch.randn(t.shape, generator=g))
            elif leaf == "scale":  # MimiLayerScale
                t.fill_(scale)
            elif "layernorm" in name or "norm." in name:
                t.fill_(1.0 if leaf == "weight" else 0.0)
            elif leaf == "bias":
                t.zero_()
            elif t.dim() >= 2:
                fan_in = int(np.prod(t.shape[1:]))
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(fan_in))
            else:
                raise ValueError(f"init_random_encoder_weights: no rule for tensor '{name}' {tuple(t.shape)}")
    encoder.clear_codebook_cache()
