"""Tests for triton_qwen3_tts.model.codec_encoder (speech-tokenizer encoder: config, size, key names)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from triton_qwen3_tts.model.codec_encoder import (
    CodecEncoder,
    build_codec_encoder,
    encode_reference,
    init_random_encoder_weights,
)
from triton_qwen3_tts.model.config import SpeechTokenizerConfig
from triton_qwen3_tts.model.presets import speech_tokenizer_config


def _st(name: str) -> SpeechTokenizerConfig:
    return SpeechTokenizerConfig.from_dict(speech_tokenizer_config(name))


@pytest.fixture(scope="module")
def tiny_encoder() -> CodecEncoder:
    enc = build_codec_encoder(_st("tiny"))
    init_random_encoder_weights(enc, 0)
    return enc


def _wav(n: int, seed: int = 0, amp: float = 0.2) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * amp).astype(np.float32)


def test_real_size_counts_and_keys_on_meta():
    with torch.device("meta"):
        enc = build_codec_encoder(_st("0.6b-base"))
    sd = enc.state_dict()
    total = sum(t.numel() for t in sd.values())
    assert len(sd) == 225
    assert total == 56_234_304  # the released encoder, counting the codebook buffers
    parts = {
        "encoder.": 12_628_256,
        "encoder_transformer.": 25_190_400,
        "downsample.": 1_048_576,
        "quantizer.": 17_367_072,
    }
    for prefix, n in parts.items():
        assert sum(t.numel() for k, t in sd.items() if k.startswith(prefix)) == n, prefix
    assert all(k.startswith(tuple(parts)) for k in sd)
    # Decoder half of Mimi is gone, as in the official encoder.
    assert enc.decoder is None and enc.decoder_transformer is None and enc.upsample is None
    assert set(k for k in sd if k.startswith("downsample.")) == {"downsample.conv.weight"}
    q = [k for k in sd if k.startswith("quantizer.")]
    pat = re.compile(
        r"quantizer\.(semantic|acoustic)_residual_vector_quantizer\."
        r"(input_proj\.weight|output_proj\.weight|layers\.(\d+)\.codebook\.(embed_sum|cluster_usage|initialized))$"
    )
    layers = {"semantic": set(), "acoustic": set()}
    for k in q:
        m = pat.match(k)
        assert m, k
        if m.group(3) is not None:
            layers[m.group(1)].add(int(m.group(3)))
    assert layers["semantic"] == {0} and layers["acoustic"] == set(range(31))
    assert tuple(sd["quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum"].shape) == (2048, 256)
    assert tuple(sd["downsample.conv.weight"].shape) == (512, 512, 4)
    assert sum(1 for k in sd if k.startswith("encoder_transformer.layers.7.")) == 12
    assert enc.valid_num_quantizers == 16 and enc.downsample_rate == 1920


@pytest.mark.parametrize("n", [1, 1919, 1920, 1921, 24000 + 5])
def test_encode_reference_shape_and_range(tiny_encoder, n):
    codes = encode_reference(tiny_encoder, _wav(n, seed=n))
    assert isinstance(codes, np.ndarray) and codes.dtype == np.int64
    assert codes.shape == (math.ceil(n / 1920), 16)
    assert codes.min() >= 0 and codes.max() < 2048


def test_codes_are_informative_and_deterministic(tiny_encoder):
    a = encode_reference(tiny_encoder, _wav(48000, seed=1))
    b = encode_reference(tiny_encoder, torch.from_numpy(_wav(48000, seed=1)))
    c = encode_reference(tiny_encoder, _wav(48000, seed=2))
    np.testing.assert_array_equal(a, b)
    assert len(np.unique(a)) > 20
    assert not np.array_equal(a, c)


def test_16_quantizer_shortcut_equals_official_slice(tiny_encoder):
    """Official: encode all 32 quantizers, keep the first 16, trim to ceil(n/1920) frames."""
    wav = _wav(24000 * 2 + 700, seed=4)
    with torch.no_grad():
        full = tiny_encoder.encode(torch.from_numpy(wav)[None, None], return_dict=True).audio_codes
    assert full.shape[1] == 32
    frames = -(-len(wav) // 1920)
    official = full[0, :16, :frames].T.numpy()
    np.testing.assert_array_equal(encode_reference(tiny_encoder, wav), official)
    eight = encode_reference(tiny_encoder, wav, valid_quantizers=8)
    np.testing.assert_array_equal(eight, official[:, :8])


def test_state_dict_roundtrip_refreshes_codebook_cache(tiny_encoder):
    wav = _wav(9600, seed=7)
    other = build_codec_encoder(_st("tiny"))
    init_random_encoder_weights(other, 123)
    before = encode_reference(other, wav)  # fills the codebook cache with seed-123 codebooks
    other.load_state_dict(tiny_encoder.state_dict())
    after = encode_reference(other, wav)
    np.testing.assert_array_equal(after, encode_reference(tiny_encoder, wav))
    assert not np.array_equal(before, after)


def test_load_with_params_on_meta_like_the_checkpoint_loader(tiny_encoder):
    with torch.device("meta"):
        enc = build_codec_encoder(_st("tiny"))
    state = {k: v.clone() for k, v in tiny_encoder.state_dict().items()}
    enc.load_state_dict(state, strict=True, assign=True)
    # Non-persistent Mimi buffers (conv strides, rotary inv_freq) are not in the checkpoint; the
    # loader builds them on CPU. Here we rebuild them from a CPU instance.
    ref = build_codec_encoder(_st("tiny"))
    for name, buf in ref.named_buffers():
        if name not in state:
            mod_name, _, leaf = name.rpartition(".")
            enc.get_submodule(mod_name)._buffers[leaf] = buf.clone()
    wav = _wav(5000, seed=9)
    np.testing.assert_array_equal(encode_reference(enc, wav), encode_reference(tiny_encoder, wav))


def test_init_random_encoder_weights():
    a = build_codec_encoder(_st("tiny"))
    init_random_encoder_weights(a, 5)
    sd = a.state_dict()
    for k, v in sd.items():
        if k.endswith(("cluster_usage", "initialized")):
            assert torch.all(v == 1), k
        if k.endswith("embed_sum"):
            assert v.std() > 0.5, k
        assert torch.isfinite(v).all(), k
    b = build_codec_encoder(_st("tiny"))
    init_random_encoder_weights(b, 5)
    for k, v in sd.items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_encode_reference_rejects_bad_input(tiny_encoder):
    with pytest.raises(ValueError, match="mono"):
        encode_reference(tiny_encoder, _wav(4000)[None].repeat(2, 0))
    with pytest.raises(ValueError, match="mono"):
        encode_reference(tiny_encoder, np.zeros(0, dtype=np.float32))
    with pytest.raises(ValueError, match="valid_quantizers"):
        encode_reference(tiny_encoder, _wav(4000), valid_quantizers=33)
    with pytest.raises(ValueError, match="valid_quantizers"):
        encode_reference(tiny_encoder, _wav(4000), valid_quantizers=0)
    with pytest.raises(TypeError):
        encode_reference(tiny_encoder, [0.0] * 4000)


def test_build_accepts_raw_dict_and_requires_encoder_config():
    d = speech_tokenizer_config("tiny")
    enc = build_codec_encoder(d)
    assert isinstance(enc, CodecEncoder) and not enc.training
    d["encoder_config"] = {}
    with pytest.raises(ValueError, match="encoder_config"):
        build_codec_encoder(d)
