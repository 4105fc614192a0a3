"""Codec decoder: official keys and parameter count, causality, windowed decode, batch independence."""

import re

import pytest
import torch

from qwen3_tts_triton import presets
from qwen3_tts_triton.codec import CodecDecoder, init_random_codec_weights, measure_window_error
from qwen3_tts_triton.config import CodecDecoderConfig

SPF = 1920


def cfg(preset):
    return CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(preset)["decoder_config"])


def test_real_size_parameter_count_matches_spec():
    with torch.device("meta"):
        d = CodecDecoder(cfg("1.7b-customvoice"))
    assert sum(p.numel() for p in d.state_dict().values()) == 114_323_137  # spec 5.7


def test_keys_follow_spec_patterns():
    c = cfg("1.7b-customvoice")
    with torch.device("meta"):
        keys = set(CodecDecoder(c).state_dict())
    patterns = [
        r"quantizer\.rvq_(first|rest)\.(input_proj|output_proj)\.weight",
        r"quantizer\.rvq_first\.vq\.layers\.0\._codebook\.(embedding_sum|cluster_usage)",
        r"quantizer\.rvq_rest\.vq\.layers\.([0-9]|1[0-4])\._codebook\.(embedding_sum|cluster_usage)",
        r"pre_conv\.conv\.(weight|bias)",
        r"pre_transformer\.(input_proj|output_proj)\.(weight|bias)", r"pre_transformer\.norm\.weight",
        r"pre_transformer\.layers\.[0-7]\.self_attn\.[qkvo]_proj\.weight",
        r"pre_transformer\.layers\.[0-7]\.mlp\.(gate|up|down)_proj\.weight",
        r"pre_transformer\.layers\.[0-7]\.(input_layernorm|post_attention_layernorm)\.weight",
        r"pre_transformer\.layers\.[0-7]\.(self_attn|mlp)_layer_scale\.scale",
        r"upsample\.[01]\.0\.conv\.(weight|bias)",
        r"upsample\.[01]\.1\.(dwconv\.conv\.(weight|bias)|norm\.(weight|bias)|pwconv[12]\.(weight|bias)|gamma)",
        r"decoder\.0\.conv\.(weight|bias)",
        r"decoder\.[1-4]\.block\.0\.(alpha|beta)", r"decoder\.[1-4]\.block\.1\.conv\.(weight|bias)",
        r"decoder\.[1-4]\.block\.[2-4]\.(act1|act2)\.(alpha|beta)",
        r"decoder\.[1-4]\.block\.[2-4]\.(conv1|conv2)\.conv\.(weight|bias)",
        r"decoder\.5\.(alpha|beta)", r"decoder\.6\.conv\.(weight|bias)",
    ]
    unmatched = [k for k in keys if not any(re.fullmatch(p, k) for p in patterns)]
    assert unmatched == []
    assert len([k for k in keys if "_codebook" in k]) == 32


@pytest.fixture(scope="module")
def dec():
    return init_random_codec_weights(CodecDecoder(cfg("tiny")), 0).eval()


def codes(b, t, seed=0):
    return torch.randint(0, 2048, (b, t, 16), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_output_is_audible_and_bounded(dec):
    y = dec.decode(codes(1, 20))
    assert y.shape == (1, 20 * SPF)
    rms = float(y.pow(2).mean().sqrt())
    assert 0.01 < rms < 0.5 and float(y.abs().max()) <= 1.0


@torch.no_grad()
def test_causal_prefix(dec):
    c = codes(1, 40)
    full = dec.decode(c)
    for t in (1, 7, 25):
        torch.testing.assert_close(dec.decode(c[:, :t]), full[:, :t * SPF], atol=1e-5, rtol=0)


@torch.no_grad()
def test_window_with_full_receptive_field_is_exact(dec):
    """With left context covering the whole receptive field (attention: layers x (window - 1),
    plus the convolutions), windowed decoding equals whole-utterance decoding."""
    reach = dec.config.num_hidden_layers * (dec.config.sliding_window - 1) + 16
    c = codes(1, reach + 10)
    full = dec.decode(c)[0, reach * SPF:]
    win = dec.decode_window(c, reach)[0]
    torch.testing.assert_close(win, full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_window_error_shrinks_with_context(dec):
    """Measured, not a bound: see docs/codec_window_error.md. Less context, more error."""
    err = measure_window_error(dec, codes(1, 200)[0], [0, 25, 72, 144])
    assert err[0] > err[72] > err[144]
    assert err[144] < 1e-5


@torch.no_grad()
def test_rows_are_independent(dec):
    c = codes(4, 30, seed=3)
    batch = dec.decode(c)
    for i in range(4):
        torch.testing.assert_close(batch[i], dec.decode(c[i:i + 1])[0], atol=1e-5, rtol=0)


def test_decode_window_validates(dec):
    with pytest.raises(ValueError, match="left_context"):
        dec.decode_window(codes(1, 5), 5)


@torch.no_grad()
def test_official_chunked_decode_matches_full_below_chunk(dec):
    c = codes(1, 50)[0]
    torch.testing.assert_close(dec.decode_official(c), dec.decode(c[None])[0], atol=1e-6, rtol=0)
