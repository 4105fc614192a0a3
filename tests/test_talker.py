"""Reference talker: key names, parameter counts (spec 6.1), KV cache, frame embedding, loop."""

import re

import pytest
import torch

from qwen3_tts_triton import presets
from qwen3_tts_triton.config import Qwen3TTSConfig
from qwen3_tts_triton.generate import generate_codes
from qwen3_tts_triton.sampling import SamplingParams
from qwen3_tts_triton.talker import Qwen3TTSModel, init_random_weights


def cfg(name):
    return Qwen3TTSConfig.from_dict(presets.main_config(name))


# spec 6.1: (tensors, params) of model.safetensors
SPEC = {
    "0.6b-base": (478, 914_643_008), "0.6b-customvoice": (402, 905_788_672),
    "1.7b-base": (480, 1_928_677_440), "1.7b-customvoice": (404, 1_916_676_352),
    "1.7b-voicedesign": (404, 1_916_676_352),
}


@pytest.mark.parametrize("preset", sorted(SPEC))
def test_real_size_counts_match_spec(preset):
    sd = Qwen3TTSModel.on_meta(cfg(preset)).state_dict()
    assert (len(sd), sum(t.numel() for t in sd.values())) == SPEC[preset]


def spec_keys(c: Qwen3TTSConfig):
    """Key set written independently from the patterns of spec 6.3."""
    keys = set()
    layer = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
             "input_layernorm.weight", "post_attention_layernorm.weight"]
    for i in range(c.talker.num_hidden_layers):
        keys |= {f"talker.model.layers.{i}.{k}" for k in layer}
    for i in range(c.talker.code_predictor.num_hidden_layers):
        keys |= {f"talker.code_predictor.model.layers.{i}.{k}" for k in layer}
    keys |= {"talker.model.norm.weight", "talker.model.codec_embedding.weight", "talker.model.text_embedding.weight",
             "talker.codec_head.weight", "talker.code_predictor.model.norm.weight"}
    keys |= {f"talker.text_projection.linear_fc{i}.{p}" for i in (1, 2) for p in ("weight", "bias")}
    keys |= {f"talker.code_predictor.model.codec_embedding.{j}.weight" for j in range(15)}
    keys |= {f"talker.code_predictor.lm_head.{j}.weight" for j in range(15)}
    if c.talker.hidden_size != c.talker.code_predictor.hidden_size:
        keys |= {"talker.code_predictor.small_to_mtp_projection.weight", "talker.code_predictor.small_to_mtp_projection.bias"}
    return keys


@pytest.mark.parametrize("preset", ["tiny", "1.7b-customvoice", "0.6b-customvoice"])
def test_talker_keys_follow_the_spec(preset):
    c = cfg(preset)
    keys = {k for k in Qwen3TTSModel.on_meta(c).state_dict() if k.startswith("talker.")}
    assert keys == spec_keys(c)


def test_base_has_speaker_encoder_keys():
    keys = Qwen3TTSModel.on_meta(cfg("1.7b-base")).state_dict()
    assert any(re.match(r"speaker_encoder\.blocks\.0\.conv\.weight", k) for k in keys)
    assert "speaker_encoder.fc.weight" in keys


@pytest.fixture(scope="module")
def tiny():
    return init_random_weights(Qwen3TTSModel(cfg("tiny")), 0).eval().talker


def test_kv_cache_equals_full_forward(tiny):
    torch.manual_seed(0)
    x = torch.randn(2, 9, 64)
    pos = torch.arange(9).expand(2, 9)
    full, _ = tiny(x, pos)
    a, c = tiny(x[:, :5], pos[:, :5])
    b, c = tiny(x[:, 5:6], pos[:, 5:6], c)
    d, _ = tiny(x[:, 6:], pos[:, 6:], c)
    torch.testing.assert_close(torch.cat([a, b, d], 1), full, atol=1e-5, rtol=0)


def test_embed_frame_is_sum_of_tables(tiny):
    codes = torch.randint(0, 2048, (3, 16))
    expected = tiny.model.codec_embedding.weight[codes[:, 0]].clone()
    for j in range(15):
        expected += tiny.code_predictor.model.codec_embedding[j].weight[codes[:, j + 1]]
    torch.testing.assert_close(tiny.embed_frame(codes), expected)


def test_predictor_codes_in_range(tiny):
    h, e = torch.randn(4, 64), torch.randn(4, 64)
    out = tiny.code_predictor.predict(h, e, lambda j, logits: logits.argmax(-1))
    assert out.shape == (4, 15) and out.min() >= 0 and out.max() < 2048


def test_predictor_prefill_plus_cache_equals_recompute(tiny):
    """Each residual step with the KV cache equals re-running the whole prefix."""
    cp = tiny.code_predictor
    h, e = torch.randn(1, 64), torch.randn(1, 64)
    codes = cp.predict(h, e, lambda j, logits: logits.argmax(-1))[0]
    seq = [h, e] + [cp.model.codec_embedding[j](codes[j:j + 1]) for j in range(14)]
    x = cp.small_to_mtp_projection(torch.stack(seq, 1))
    out, _ = cp.model(x, torch.arange(16)[None])
    for j in range(15):
        assert int(cp.lm_head[j](out[:, j + 1]).argmax(-1)) == int(codes[j])


def test_generate_lengths_and_eos(tiny):
    pe, tr, pad = torch.randn(9, 64), torch.randn(3, 64), torch.randn(64)
    codes = generate_codes(tiny, pe, tr, pad, SamplingParams(do_sample=False, subtalker_dosample=False, max_new_tokens=10))
    assert codes.shape[1] == 16 and codes.shape[0] <= 9
    assert (codes[:, 0] < 2048).all()
    fixed = generate_codes(tiny, pe, tr, pad, SamplingParams(max_new_tokens=12, seed=1, ignore_eos=True))
    assert fixed.shape == (11, 16)  # N tokens -> N-1 frames, EOS never sampled


def test_generate_streams_frames(tiny):
    got = []
    pe, tr, pad = torch.randn(5, 64), torch.randn(0, 64), torch.randn(64)
    codes = generate_codes(tiny, pe, tr, pad, SamplingParams(max_new_tokens=6, seed=0, ignore_eos=True), on_frame=got.append)
    assert torch.equal(torch.stack(got), codes)
