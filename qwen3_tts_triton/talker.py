"""Reference Qwen3-TTS talker and code predictor in plain PyTorch (spec sections 1-2).

The module tree mirrors the official checkpoint, so ``Qwen3TTSModel(config).state_dict()`` has
exactly the keys of ``model.safetensors`` (``talker.*`` and, for Base models, ``speaker_encoder.*``)
and loads without remapping. Rotary frequencies are not persistent buffers (the checkpoint has none).

This is the *reference*: simple, one request at a time (batch rows of equal length are fine),
with a plain list-of-tensors KV cache. The vLLM plugin and the native engine are checked against it.
Imports neither vLLM nor Triton.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import CodePredictorConfig, Qwen3TTSConfig, TalkerConfig

KVCache = List[Tuple[torch.Tensor, torch.Tensor]]


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back, then scaled (as the official Qwen3TTSRMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Rotary(nn.Module):
    """Plain 1-D rotate-half RoPE. With the three identical position streams the talker uses,
    the official interleaved M-RoPE equals this exactly (spec 1.3)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float()[..., None] * self.inv_freq.float().to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, k, cos, sin):
    # q, k: [B, H, T, hd]; cos/sin: [B, T, hd] -> broadcast over heads
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)  # QK-norm per head, before RoPE
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x, cos, sin, cache: Optional[Tuple[torch.Tensor, torch.Tensor]]):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        past = 0
        if cache is not None:
            past = cache[0].shape[2]
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        new_cache = (k, v)
        rep = self.heads // self.kv_heads
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        # causal over the new rows, full over the cached ones
        s = k.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(diagonal=past)
        att = (q @ kk.transpose(-1, -2)) * (self.head_dim ** -0.5)
        att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        out = (att @ vv).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out), new_cache


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, cache):
        h, cache = self.self_attn(self.input_layernorm(x), cos, sin, cache)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, cache


def _run_layers(layers, norm, rotary, x, positions, cache: Optional[KVCache]):
    cos, sin = rotary(positions, x.dtype)
    new_cache: KVCache = []
    for i, layer in enumerate(layers):
        x, kv = layer(x, cos, sin, None if cache is None else cache[i])
        new_cache.append(kv)
    return norm(x), new_cache


class TalkerBackbone(nn.Module):
    """``talker.model``: 28 Qwen3 layers, final norm, codec and text embeddings."""

    def __init__(self, c: TalkerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(c.text_vocab_size, c.text_hidden_size)
        self.rotary = Rotary(c.head_dim, c.rope_theta)

    def forward(self, embeds, positions, cache=None):
        return _run_layers(self.layers, self.norm, self.rotary, embeds, positions, cache)


class TextProjection(nn.Module):
    """``talker.text_projection``: fc2(silu(fc1(x))), with biases."""

    def __init__(self, d_text: int, d: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(d_text, d_text, bias=True)
        self.linear_fc2 = nn.Linear(d_text, d, bias=True)

    def forward(self, x):
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class CodePredictorBackbone(nn.Module):
    """``talker.code_predictor.model``: 5 layers, norm, 15 residual-codebook tables of talker width."""

    def __init__(self, c: CodePredictorConfig, talker_hidden: int):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(c.vocab_size, talker_hidden) for _ in range(c.num_code_groups - 1))
        self.rotary = Rotary(c.head_dim, c.rope_theta)

    def forward(self, embeds, positions, cache=None):
        return _run_layers(self.layers, self.norm, self.rotary, embeds, positions, cache)


class CodePredictor(nn.Module):
    """``talker.code_predictor``: predicts codebooks 1..15 of a frame from (h, c0) (spec 2.3)."""

    def __init__(self, c: CodePredictorConfig, talker_hidden: int):
        super().__init__()
        self.config = c
        self.model = CodePredictorBackbone(c, talker_hidden)
        self.lm_head = nn.ModuleList(nn.Linear(c.hidden_size, c.vocab_size, bias=False)
                                     for _ in range(c.num_code_groups - 1))
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, c.hidden_size, bias=True)
                                        if talker_hidden != c.hidden_size else nn.Identity())

    def predict(self, h: torch.Tensor, c0_embed: torch.Tensor, sample) -> torch.Tensor:
        """h, c0_embed: [B, D] (talker width). ``sample(step, logits [B, V]) -> ids [B]``.
        Returns the residual codes [B, 15]: one 2-row prefill, then 14 single-row steps."""
        b = h.shape[0]
        x = self.small_to_mtp_projection(torch.stack([h, c0_embed], dim=1))  # [B, 2, Dcp]
        pos = torch.arange(2, device=h.device).expand(b, 2)
        out, cache = self.model(x, pos, None)
        codes = []
        for j in range(self.config.num_code_groups - 1):
            logits = self.lm_head[j](out[:, -1])
            c = sample(j, logits)
            codes.append(c)
            if j == self.config.num_code_groups - 2:
                break  # c15 is never fed back
            e = self.small_to_mtp_projection(self.model.codec_embedding[j](c))[:, None]
            pos = torch.full((b, 1), j + 2, device=h.device, dtype=torch.long)
            out, cache = self.model(e, pos, cache)
        return torch.stack(codes, dim=1)


class Talker(nn.Module):
    """``talker``: backbone, text projection, codebook-0 head, code predictor."""

    def __init__(self, c: TalkerConfig):
        super().__init__()
        self.config = c
        self.model = TalkerBackbone(c)
        self.text_projection = TextProjection(c.text_hidden_size, c.hidden_size)
        self.codec_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.code_predictor = CodePredictor(c.code_predictor, c.hidden_size)

    def _ids(self, ids):
        return torch.as_tensor(ids, dtype=torch.long, device=self.codec_head.weight.device)

    def embed_text(self, ids) -> torch.Tensor:
        """T(id) = text_projection(text_embedding(id))."""
        return self.text_projection(self.model.text_embedding(self._ids(ids)))

    def embed_codec(self, ids) -> torch.Tensor:
        """C(id) = codec_embedding(id)."""
        return self.model.codec_embedding(self._ids(ids))

    def embed_frame(self, codes) -> torch.Tensor:
        """F(frame) = C(c0) + sum_j E_j(c_j), all in talker width (spec 3.3)."""
        codes = self._ids(codes)
        out = self.model.codec_embedding(codes[..., 0])
        for j, emb in enumerate(self.code_predictor.model.codec_embedding):
            out = out + emb(codes[..., j + 1])
        return out

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, cache: Optional[KVCache] = None):
        """Backbone over input embeddings [B, T, D]; returns (final-norm hidden [B, T, D], cache)."""
        return self.model(embeds, positions, cache)

    def codec_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)


class Qwen3TTSModel(nn.Module):
    """Everything in ``model.safetensors``: the talker and, for Base models, the speaker encoder."""

    def __init__(self, config: Qwen3TTSConfig):
        super().__init__()
        self.config = config
        self.talker = Talker(config.talker)
        if config.speaker_encoder is not None:
            from .speaker_encoder import SpeakerEncoder

            self.speaker_encoder = SpeakerEncoder(config.speaker_encoder)
        else:
            self.speaker_encoder = None

    @classmethod
    def on_meta(cls, config: Qwen3TTSConfig) -> "Qwen3TTSModel":
        with torch.device("meta"):
            return cls(config)


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> nn.Module:
    """Deterministic random init: Linear/Embedding ~ N(0, std), biases 0, norm weights 1."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * std)
    spk = getattr(model, "speaker_encoder", None)
    if spk is not None:
        try:
            from .speaker_encoder import init_random_speaker_encoder_weights

            init_random_speaker_encoder_weights(spk, seed)
        except ImportError:
            pass
    return model
