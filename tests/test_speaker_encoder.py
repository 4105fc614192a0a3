"""Tests for triton_qwen3_tts.model.speaker_encoder (ECAPA-TDNN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from triton_qwen3_tts.model.audio import mel_spectrogram
from triton_qwen3_tts.model.config import Qwen3TTSConfig, SpeakerEncoderConfig
from triton_qwen3_tts.model.presets import main_config
from triton_qwen3_tts.model.speaker_encoder import (
    SpeakerEncoder,
    extract_speaker_embedding,
    init_random_speaker_encoder_weights,
)


def _official_keys(scale: int = 8) -> set[str]:
    """The checkpoint's ``speaker_encoder.*`` names without the prefix."""
    convs = ["blocks.0.conv", "mfa.conv", "asp.tdnn.conv", "asp.conv", "fc"]
    for b in (1, 2, 3):
        convs += [
            f"blocks.{b}.tdnn1.conv",
            f"blocks.{b}.tdnn2.conv",
            f"blocks.{b}.se_block.conv1",
            f"blocks.{b}.se_block.conv2",
        ]
        convs += [f"blocks.{b}.res2net_block.blocks.{i}.conv" for i in range(scale - 1)]
    return {f"{c}.{p}" for c in convs for p in ("weight", "bias")}


def _tiny_cfg() -> SpeakerEncoderConfig:
    cfg = Qwen3TTSConfig.from_dict(main_config("tiny-base")).speaker_encoder
    assert cfg is not None
    return cfg


def _tiny_encoder(seed: int = 0) -> SpeakerEncoder:
    enc = SpeakerEncoder(_tiny_cfg()).eval()
    init_random_speaker_encoder_weights(enc, seed)
    return enc


@pytest.mark.parametrize("enc_dim,expected", [(1024, 8_854_336), (2048, 12_001_088)])
def test_real_size_param_count_and_keys(enc_dim, expected):
    with torch.device("meta"):
        enc = SpeakerEncoder(SpeakerEncoderConfig(enc_dim=enc_dim))
    sd = enc.state_dict()
    assert set(sd) == _official_keys(8)
    assert sum(t.numel() for t in sd.values()) == expected
    assert sum(p.numel() for p in enc.parameters()) == expected  # no buffers
    # The official shapes: k5 TDNN 128->512, 7 res2net convs at 64 ch k3, MFA 1536, ASP 4608->128.
    assert tuple(sd["blocks.0.conv.weight"].shape) == (512, 128, 5)
    assert tuple(sd["blocks.2.res2net_block.blocks.6.conv.weight"].shape) == (64, 64, 3)
    assert tuple(sd["blocks.1.se_block.conv1.weight"].shape) == (128, 512, 1)
    assert tuple(sd["mfa.conv.weight"].shape) == (1536, 1536, 1)
    assert tuple(sd["asp.tdnn.conv.weight"].shape) == (128, 4608, 1)
    assert tuple(sd["asp.conv.weight"].shape) == (1536, 128, 1)
    assert tuple(sd["fc.weight"].shape) == (enc_dim, 3072, 1)


def test_convs_use_reflect_same_padding_and_dilations():
    with torch.device("meta"):
        enc = SpeakerEncoder(SpeakerEncoderConfig())
    convs = {n: m for n, m in enc.named_modules() if isinstance(m, nn.Conv1d)}
    assert len(convs) == len(_official_keys(8)) // 2
    for name, m in convs.items():
        assert m.padding == "same" and m.padding_mode == "reflect" and m.bias is not None, name
    assert convs["blocks.1.res2net_block.blocks.0.conv"].dilation == (2,)
    assert convs["blocks.3.res2net_block.blocks.0.conv"].dilation == (4,)
    assert convs["blocks.0.conv"].kernel_size == (5,)


def test_tiny_forward_shape_batch_and_input_dependence():
    enc = _tiny_encoder()
    cfg = _tiny_cfg()
    g = torch.Generator().manual_seed(0)
    mels = torch.randn(3, 40, cfg.mel_dim, generator=g)
    with torch.no_grad():
        out = enc(mels)
        single = enc(mels[1:2])
    assert out.shape == (3, cfg.enc_dim) and torch.isfinite(out).all()
    torch.testing.assert_close(out[1:2], single, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out[0], out[1])
    # Pooling is over time: the output does not grow with the length of a repeated input.
    with torch.no_grad():
        rep = enc(mels[:1].repeat(1, 2, 1))
    assert rep.shape == (1, cfg.enc_dim)


def test_res2net_first_group_passes_through():
    enc = _tiny_encoder()
    r2n = enc.blocks[1].res2net_block
    x = torch.randn(2, 32, 12)
    with torch.no_grad():
        y = r2n(x)
    width = 32 // r2n.scale
    torch.testing.assert_close(y[:, :width], x[:, :width])
    assert not torch.allclose(y[:, width : 2 * width], x[:, width : 2 * width])


def test_extract_speaker_embedding_numpy_and_tensor():
    enc = _tiny_encoder(seed=3)
    rng = np.random.default_rng(1)
    wav = (rng.standard_normal(24000) * 0.1).astype(np.float32)
    a = extract_speaker_embedding(enc, wav)
    b = extract_speaker_embedding(enc, torch.from_numpy(wav))
    assert a.shape == (enc.config.enc_dim,)
    torch.testing.assert_close(a, b)
    with torch.no_grad():
        direct = enc(mel_spectrogram(torch.from_numpy(wav)[None]))[0]
    torch.testing.assert_close(a, direct)
    other = extract_speaker_embedding(enc, (rng.standard_normal(24000) * 0.3).astype(np.float32))
    assert not torch.allclose(a, other)


def test_extract_in_bfloat16_model():
    enc = _tiny_encoder().to(torch.bfloat16)
    wav = (np.random.default_rng(2).standard_normal(12000) * 0.1).astype(np.float32)
    out = extract_speaker_embedding(enc, wav)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_rejects_bad_input():
    enc = _tiny_encoder()
    with pytest.raises(ValueError, match="mels"):
        enc(torch.zeros(1, 20, 64))
    with pytest.raises(ValueError, match="at least"):
        enc(torch.zeros(1, enc.min_frames - 1, 128))
    with pytest.raises(ValueError):
        SpeakerEncoder(SpeakerEncoderConfig(enc_channels=(512, 512, 512, 1536), enc_kernel_sizes=(5, 3, 3, 3, 1)))


def test_init_random_is_deterministic():
    a, b = _tiny_encoder(seed=5), _tiny_encoder(seed=5)
    c = _tiny_encoder(seed=6)
    for k, v in a.state_dict().items():
        torch.testing.assert_close(v, b.state_dict()[k])
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())
