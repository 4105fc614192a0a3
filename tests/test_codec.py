"""Codec decoder: official keys and parameter count, causality, windowed decode, batch
independence, ONNX export, and (opt-in) bit parity with the official qwen-tts decoder.

All fast tests use the tiny preset. The real-size decoder is only built on the meta device.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights, measure_window_error
from triton_qwen3_tts.model.config import CodecDecoderConfig

SPF = 1920
ROOT = Path(__file__).resolve().parents[1]


def cfg(preset: str) -> CodecDecoderConfig:
    return CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(preset)["decoder_config"])


def codes(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 2048, (b, t, 16), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def real_meta() -> CodecDecoder:
    with torch.device("meta"):
        return CodecDecoder(cfg("1.7b-customvoice"))


@pytest.fixture(scope="module")
def dec() -> CodecDecoder:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return init_random_codec_weights(CodecDecoder(cfg("tiny")), 0).eval()


# --- structure ------------------------------------------------------------------------------


def test_real_size_parameter_count_matches_spec(real_meta):
    """The released decoder has 114,323,137. Every checkpoint tensor (codebooks included) is a parameter, as in
    the official module, so parameters() and the state dict give the same total."""
    assert sum(p.numel() for p in real_meta.parameters()) == 114_323_137
    assert sum(v.numel() for v in real_meta.state_dict().values()) == 114_323_137
    parts = {name: sum(p.numel() for p in m.parameters()) for name, m in real_meta.named_children()}
    assert parts == {
        "quantizer": 8_945_664,
        "pre_conv": 1_573_888,
        "pre_transformer": 30_427_136,
        "upsample": 21_006_336,
        "decoder": 52_370_113,
    }


def test_keys_follow_spec_patterns(real_meta):
    keys = set(real_meta.state_dict())
    patterns = [
        r"quantizer\.rvq_(first|rest)\.(input_proj|output_proj)\.weight",
        r"quantizer\.rvq_first\.vq\.layers\.0\._codebook\.(embedding_sum|cluster_usage)",
        r"quantizer\.rvq_rest\.vq\.layers\.([0-9]|1[0-4])\._codebook\.(embedding_sum|cluster_usage)",
        r"pre_conv\.conv\.(weight|bias)",
        r"pre_transformer\.(input_proj|output_proj)\.(weight|bias)",
        r"pre_transformer\.norm\.weight",
        r"pre_transformer\.layers\.[0-7]\.self_attn\.[qkvo]_proj\.weight",
        r"pre_transformer\.layers\.[0-7]\.mlp\.(gate|up|down)_proj\.weight",
        r"pre_transformer\.layers\.[0-7]\.(input_layernorm|post_attention_layernorm)\.weight",
        r"pre_transformer\.layers\.[0-7]\.(self_attn|mlp)_layer_scale\.scale",
        r"upsample\.[01]\.0\.conv\.(weight|bias)",
        r"upsample\.[01]\.1\.(dwconv\.conv\.(weight|bias)|norm\.(weight|bias)|pwconv[12]\.(weight|bias)|gamma)",
        r"decoder\.0\.conv\.(weight|bias)",
        r"decoder\.[1-4]\.block\.0\.(alpha|beta)",
        r"decoder\.[1-4]\.block\.1\.conv\.(weight|bias)",
        r"decoder\.[1-4]\.block\.[2-4]\.(act1|act2)\.(alpha|beta)",
        r"decoder\.[1-4]\.block\.[2-4]\.(conv1|conv2)\.conv\.(weight|bias)",
        r"decoder\.5\.(alpha|beta)",
        r"decoder\.6\.conv\.(weight|bias)",
    ]
    assert sorted(k for k in keys if not any(re.fullmatch(p, k) for p in patterns)) == []
    for p in patterns:  # and every pattern is used
        assert any(re.fullmatch(p, k) for k in keys), p
    assert len(keys) == 271  # the official decoder's state dict (inv_freq is not persistent)
    assert len([k for k in keys if "_codebook" in k]) == 32
    sd = real_meta.state_dict()
    assert sd["quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"].shape == (2048, 256)
    assert sd["quantizer.rvq_rest.output_proj.weight"].shape == (512, 256, 1)
    assert sd["pre_transformer.layers.0.self_attn.q_proj.weight"].shape == (1024, 512)
    assert sd["upsample.0.0.conv.weight"].shape == (1024, 1024, 2)  # ConvTranspose1d: [in, out, k]
    assert sd["decoder.1.block.1.conv.weight"].shape == (1536, 768, 16)
    assert sd["decoder.6.conv.weight"].shape == (1, 96, 7)


# --- behaviour (tiny random decoder) --------------------------------------------------------


@torch.no_grad()
def test_output_is_audible_and_bounded(dec):
    y = dec.decode(codes(1, 20))
    assert y.shape == (1, 20 * SPF) and y.dtype == torch.float32
    rms = float(y.pow(2).mean().sqrt())
    assert 0.01 < rms < 0.5 and float(y.abs().max()) <= 1.0
    assert dec(codes(2, 3).transpose(1, 2)).shape == (2, 1, 3 * SPF)  # official layout


@torch.no_grad()
def test_sliding_window_is_72_including_current_position(dec):
    """HF's window of 72 includes the current position: through one pre-transformer layer a change
    to frame 0 reaches frame 71 (q - k = 71 < 72) and nothing from frame 72 on."""
    pt = dec.pre_transformer
    x = torch.randn(1, 100, dec.config.latent_dim, generator=torch.Generator().manual_seed(5))
    y = x.clone()
    y[:, 0] += 1.0
    layers = pt.layers
    try:
        pt.layers = layers[:1]
        diff = (pt(x) - pt(y)).abs().amax(-1)[0]
    finally:
        pt.layers = layers
    assert float(diff[71]) > 1e-4 and float(diff[72:].max()) == 0.0


@torch.no_grad()
def test_causal_prefix(dec):
    c = codes(1, 40)
    full = dec.decode(c)
    for t in (1, 7, 25):
        torch.testing.assert_close(dec.decode(c[:, :t]), full[:, : t * SPF], atol=1e-5, rtol=0)


@torch.no_grad()
def test_window_with_full_receptive_field_is_exact(dec):
    """Left context covering the receptive field (attention: layers x (window - 1) = 142 frames
    for tiny, plus the convolutions' ~13) makes windowed decoding equal whole decoding."""
    reach = dec.config.num_hidden_layers * (dec.config.sliding_window - 1) + 16
    c = codes(1, reach + 10)
    full = dec.decode(c)[0, reach * SPF :]
    win = dec.decode_window(c, reach)[0]
    torch.testing.assert_close(win, full, atol=1e-5, rtol=0)


@torch.no_grad()
def test_window_error_measured_facts(dec):
    """What is true (docs/codec_window_error.md): 72 frames of context are NOT within 1e-5 of
    whole-utterance decoding (the second attention layer still sees earlier frames); 144 frames
    (tiny's full attention reach) are. The error falls as context grows."""
    err = measure_window_error(dec, codes(1, 170)[0], [0, 72, 144], new_frames=10)
    assert err[0] > err[72] > err[144]
    assert err[72] > 1e-5
    assert err[144] < 1e-5


@torch.no_grad()
def test_rows_are_independent(dec):
    c = codes(4, 30, seed=3)
    batch = dec.decode(c)
    for i in range(4):
        torch.testing.assert_close(batch[i], dec.decode(c[i : i + 1])[0], atol=1e-5, rtol=0)


@torch.no_grad()
def test_decode_window_shape_and_validation(dec):
    c = codes(2, 6)
    assert dec.decode_window(c, 0).shape == (2, 6 * SPF)
    assert dec.decode_window(c, 4).shape == (2, 2 * SPF)
    for bad in (6, 7, -1, True, 2.0):
        with pytest.raises(ValueError, match="left_context"):
            dec.decode_window(c, bad)


@torch.no_grad()
def test_official_chunked_decode(dec):
    """Below one chunk it is the plain decode; above, chunk 2 is decoded with 25 frames of context."""
    c = codes(1, 40)[0]
    torch.testing.assert_close(dec.decode_official(c), dec.decode(c[None])[0], atol=1e-6, rtol=0)
    c = codes(1, 12)[0]
    got = dec.decode_official(c, chunk=5, context=3)  # chunks [0,5) [5,10) [10,12)
    want = torch.cat(
        [dec.decode(c[None, :5])[0], dec.decode_window(c[None, 2:10], 3)[0], dec.decode_window(c[None, 7:12], 3)[0]]
    )
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# --- ONNX -----------------------------------------------------------------------------------


def test_onnx_export_dynamic_batch_and_frames(dec, tmp_path):
    """TorchScript exporter (dynamo=False), opset 18, dynamic batch and frames; onnxruntime
    matches PyTorch within 1e-4 at two shapes other than the example one."""
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "codec.onnx"
    with torch.no_grad():
        torch.onnx.export(
            dec,
            (codes(2, 8).transpose(1, 2),),
            str(path),
            dynamo=False,
            opset_version=18,
            input_names=["codes"],
            output_names=["audio"],
            dynamic_axes={"codes": {0: "batch", 2: "frames"}, "audio": {0: "batch", 2: "samples"}},
        )
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, t in [(1, 10), (3, 37)]:
        c = codes(b, t, seed=b * 100 + t).transpose(1, 2).contiguous()
        got = sess.run(None, {"codes": c.numpy()})[0]
        with torch.no_grad():
            want = dec(c).numpy()
        assert got.shape == (b, 1, t * SPF)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


# --- parity with the official package (opt-in) ---------------------------------------------

_PARITY = textwrap.dedent("""
    import sys, types, importlib, torch
    src = sys.argv[1]
    for name, sub in [("qwen_tts", ""), ("qwen_tts.core", "/core"), ("qwen_tts.core.tokenizer_12hz", "/core/tokenizer_12hz")]:
        m = types.ModuleType(name); m.__path__ = [src + "/qwen_tts" + sub]; sys.modules[name] = m
    mod = importlib.import_module("qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2")
    conf = importlib.import_module("qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2")
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    d = presets.speech_tokenizer_config("tiny")["decoder_config"]
    ours = init_random_codec_weights(CodecDecoder(CodecDecoderConfig.from_dict(d)), 0).eval()
    oc = conf.Qwen3TTSTokenizerV2DecoderConfig(**d); oc._attn_implementation = "eager"
    off = mod.Qwen3TTSTokenizerV2Decoder(oc).eval()
    off.load_state_dict(ours.state_dict(), strict=True)
    c = torch.randint(0, 2048, (2, 16, 160), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        e1 = float((off(c) - ours(c)).abs().max())
        e2 = float((off.chunked_decode(c[:1, :, :140], 50, 25)[0, 0] - ours.decode_official(c[0, :, :140].t(), 50, 25)).abs().max())
    print("MAXDIFF", e1, e2)
""")


@pytest.mark.skipif(
    not os.environ.get("QWEN3_TTS_OFFICIAL_SRC"),
    reason="set QWEN3_TTS_OFFICIAL_SRC=<dir holding qwen_tts/> (qwen-tts==0.1.1) and, "
    "if the venv's transformers is not 4.57.x, QWEN3_TTS_OFFICIAL_PYTHONPATH=<dir with it>",
)
def test_bit_parity_with_official_decoder():
    """Our decoder with the official decoder's weights gives the official output (eager attention:
    bit-identical; window 72, 160 frames so the sliding window matters; chunked decode too)."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    extra = os.environ.get("QWEN3_TTS_OFFICIAL_PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, str(ROOT)) if p)
    r = subprocess.run(
        [sys.executable, "-c", _PARITY, os.environ["QWEN3_TTS_OFFICIAL_SRC"]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    e1, e2 = (float(x) for x in r.stdout.split("MAXDIFF")[1].split())
    assert e1 <= 1e-6 and e2 <= 1e-6
