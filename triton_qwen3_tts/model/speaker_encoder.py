"""ECAPA-TDNN speaker encoder of the Base models (x-vector for voice cloning).

Follows the official ``Qwen3TTSSpeakerEncoder`` (https://github.com/QwenLM/Qwen3-TTS). Module
names equal the official ones so that the checkpoint's
``speaker_encoder.*`` tensors load without remapping (our keys are those without the prefix):

    blocks.0.conv                                   TDNN, k5, mel_dim -> C
    blocks.{1,2,3}.tdnn1.conv / .tdnn2.conv         1x1 TDNNs of the SE-Res2Net blocks
    blocks.{1,2,3}.res2net_block.blocks.{0..s-2}.conv
    blocks.{1,2,3}.se_block.conv1 / .conv2          squeeze-excitation
    mfa.conv                                        multi-layer feature aggregation
    asp.tdnn.conv / asp.conv                        attentive statistics pooling
    fc                                              1x1 conv 2*C_last -> enc_dim

Every conv is ``Conv1d(padding="same", padding_mode="reflect")`` with a bias, like the
official code (it matters for the k3/k5 convs at the utterance edges). There is no output
normalisation. The official pooling supports a padding mask but is always called with full
lengths; we implement only that case (one utterance per row, no padding inside a batch).

Imports neither vLLM nor Triton.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import torch
from torch import nn

from triton_qwen3_tts.model.audio import as_waveform_tensor, mel_spectrogram
from triton_qwen3_tts.model.config import SpeakerEncoderConfig

__all__ = ["SpeakerEncoder", "extract_speaker_embedding", "init_random_speaker_encoder_weights"]

_STD_EPS = 1e-12  # clamp of the variance before sqrt in the pooling statistics


def _conv(in_ch: int, out_ch: int, kernel_size: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_ch, out_ch, kernel_size, dilation=dilation, padding="same", padding_mode="reflect")


class _TDNN(nn.Module):
    """Conv1d + ReLU (official ``TimeDelayNetBlock``); the conv is named ``conv``."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, dilation: int):
        super().__init__()
        self.conv = _conv(in_ch, out_ch, kernel_size, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class _Res2Net(nn.Module):
    """Split channels into ``scale`` groups; group 0 passes through, group i>0 goes through TDNN
    i-1 after adding the previous group's output (hierarchical residual connections)."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int):
        super().__init__()
        if channels % scale:
            raise ValueError(f"res2net: channels {channels} not divisible by scale {scale}")
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(_TDNN(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        prev = None
        for i in range(1, self.scale):
            inp = parts[i] if i == 1 else parts[i] + prev
            prev = self.blocks[i - 1](inp)
            outs.append(prev)
        return torch.cat(outs, dim=1)


class _SqueezeExcite(nn.Module):
    """Channel gate from the time-averaged features: sigmoid(conv2(relu(conv1(mean_t x))))."""

    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=2, keepdim=True)
        s = torch.sigmoid(self.conv2(torch.relu(self.conv1(s))))
        return x * s


class _SERes2NetBlock(nn.Module):
    """TDNN(1x1) -> Res2Net -> TDNN(1x1) -> SE, plus the identity residual."""

    def __init__(self, in_ch: int, out_ch: int, scale: int, se_channels: int, kernel_size: int, dilation: int):
        super().__init__()
        if in_ch != out_ch:
            # The official block adds the residual without a projection.
            raise ValueError(f"SE-Res2Net block needs in == out channels, got {in_ch} -> {out_ch}")
        self.tdnn1 = _TDNN(in_ch, out_ch, 1, 1)
        self.res2net_block = _Res2Net(out_ch, scale, kernel_size, dilation)
        self.tdnn2 = _TDNN(out_ch, out_ch, 1, 1)
        self.se_block = _SqueezeExcite(out_ch, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))
        return h + x


def _weighted_stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std over time of ``x`` [B, C, T] with weights ``w`` (summing to 1 over T).

    Written as the official ``sum(w * x)`` rather than ``x.mean()`` so the rounding matches.
    """
    mean = (w * x).sum(dim=2)
    var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=_STD_EPS))


class _AttentiveStatsPool(nn.Module):
    """Attentive statistics pooling: [B, C, T] -> [B, 2C, 1]."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = _TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform)
        # Global context: every frame sees the utterance mean and std.
        ctx = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = _weighted_stats(x, attn)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: ``forward(mels [B, frames, mel_dim]) -> [B, enc_dim]``.

    Needs at least ``max(dilation * (kernel - 1) / 2) + 1`` frames (reflect padding); with the
    real config that is 5 frames (1280 samples at 24 kHz).
    """

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        ch, ks, dil = tuple(cfg.enc_channels), tuple(cfg.enc_kernel_sizes), tuple(cfg.enc_dilations)
        if not len(ch) == len(ks) == len(dil) or len(ch) < 3:
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations need the same length (>= 3)")
        self.config = cfg
        self.blocks = nn.ModuleList([_TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(
                _SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
            )
        if sum(ch[1:-1]) != ch[-1]:
            raise ValueError(
                f"enc_channels[-1]={ch[-1]} must equal the sum of the SE-Res2Net block "
                f"widths {sum(ch[1:-1])} (MFA concatenates them)"
            )
        self.mfa = _TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = _AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)
        # Frames needed so that every reflect pad is shorter than its input.
        self.min_frames = max((k - 1) * d // 2 for k, d in zip(ks, dil)) + 1

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        if mels.dim() != 3 or mels.shape[-1] != self.config.mel_dim:
            raise ValueError(f"expected mels [B, frames, {self.config.mel_dim}], got {tuple(mels.shape)}")
        if mels.shape[1] < self.min_frames:
            raise ValueError(f"need at least {self.min_frames} mel frames, got {mels.shape[1]}")
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        x = self.fc(self.asp(x))
        return x.squeeze(-1)


@torch.inference_mode()
def extract_speaker_embedding(encoder: SpeakerEncoder, wav_24k: Union[np.ndarray, torch.Tensor]) -> torch.Tensor:
    """x-vector ``[enc_dim]`` of one mono 24 kHz waveform (official ``extract_speaker_embedding``).

    The mel is computed where the waveform lives (CPU for numpy input, as the official code
    does), in float32, then moved to the encoder's device and dtype.
    """
    wav = as_waveform_tensor(wav_24k)
    mels = mel_spectrogram(wav.unsqueeze(0))
    p = next(encoder.parameters())
    return encoder(mels.to(device=p.device, dtype=p.dtype))[0]


def init_random_speaker_encoder_weights(encoder: SpeakerEncoder, seed: int) -> None:
    """Deterministic random weights for test checkpoints: conv weights ~ N(0, 1/fan_in), biases 0.

    Keeps activations O(1) through the depth so random x-vectors are finite and input-dependent.
    """
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, p in encoder.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            else:
                fan_in = p.shape[1] * p.shape[2]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
