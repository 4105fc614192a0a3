"""Reference Qwen3-TTS talker and code predictor in plain PyTorch.

Why this module exists: it is the *reference* the serving paths (the vLLM plugin, exported
engines) are checked against, and the model the random-checkpoint writer instantiates. It is
therefore written for clarity and exactness, not speed: one request at a time (or batch rows of
equal length), a plain list-of-tensors KV cache, eager attention with an fp32 softmax.

The module tree mirrors the official checkpoint, so ``Qwen3TTSModel(config).state_dict()`` has
exactly the keys of ``model.safetensors`` (``talker.*`` and, for Base models,
``speaker_encoder.*``) and loads without remapping. Rotary frequencies are non-persistent
buffers: the checkpoint has none.

Notation: T(id) = text_projection(text_embedding(id)); C(id) = the talker's
codec_embedding row; E_j = code_predictor.model.codec_embedding[j-1] (talker width) embeds
codebook j = 1..15; F(frame) = C(c0) + sum_j E_j(c_j).

Imports neither vLLM nor Triton.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from triton_qwen3_tts.model.config import CodePredictorConfig, Qwen3TTSConfig, TalkerConfig

__all__ = [
    "KVCache",
    "RMSNorm",
    "RotaryEmbedding",
    "Attention",
    "MLP",
    "DecoderLayer",
    "TalkerBackbone",
    "TextProjection",
    "CodePredictorBackbone",
    "CodePredictor",
    "Talker",
    "Qwen3TTSModel",
    "ResidualSampler",
    "init_random_weights",
]

#: Per layer ``(k, v)``, each ``[B, num_key_value_heads, S, head_dim]`` (after RoPE on k).
KVCache = List[Tuple[torch.Tensor, torch.Tensor]]

#: ``sampler(codebook, logits [B, V]) -> ids [B]``; ``codebook`` is the codebook number 1..15.
ResidualSampler = Callable[[int, torch.Tensor], torch.Tensor]

IdsLike = Union[int, Sequence[int], torch.Tensor]


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in fp32, cast back to the input dtype, then scale.

    The cast happens *before* the weight multiply (as the official ``Qwen3TTSRMSNorm``); in
    bf16 this order changes the rounding, so it is kept exactly.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    """Plain 1-D rotate-half RoPE (pairs ``(i, i + head_dim/2)``).

    The talker's official interleaved M-RoPE with three identical position streams equals this
    bit for bit (its three sections then rotate by the same positions); the code predictor uses
    plain RoPE anyway. ``inv_freq`` is a non-persistent buffer (absent from the checkpoint) and is
    recomputed if the module was built on the meta device.
    """

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rotate-half RoPE, got {head_dim}")
        self.head_dim, self.theta = head_dim, float(theta)
        self.register_buffer("inv_freq", self._inv_freq(None), persistent=False)

    def _inv_freq(self, device) -> torch.Tensor:
        exps = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        return 1.0 / (self.theta**exps)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """positions ``[B, T]`` (int) -> ``(cos, sin)``, each ``[B, T, head_dim]`` in ``dtype``.

        Computed in fp32 and cast at the end, as the official rotary module does.
        """
        inv = self.inv_freq
        if inv.is_meta or inv.device != positions.device:
            inv = self._inv_freq(positions.device)
        freqs = positions.to(torch.float32)[..., None] * inv.to(torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, T, hd]``; cos/sin ``[B, T, hd]`` broadcast over heads."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class Attention(nn.Module):
    """Qwen3 GQA self-attention: no biases, per-head QK RMSNorm before RoPE, scale 1/sqrt(hd)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: Optional[Tuple[torch.Tensor, torch.Tensor]]
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        n_past = 0
        if past is not None:
            n_past = past[0].shape[2]
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        rep = self.heads // self.kv_heads
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        # New row i (absolute index n_past + i) sees every cached row and new rows <= i.
        allowed = torch.ones(t, n_past + t, dtype=torch.bool, device=x.device).tril(diagonal=n_past)
        scores = (q @ kk.transpose(-1, -2)) * (self.head_dim**-0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = (probs @ vv).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Qwen3 block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, c: Union[TalkerConfig, CodePredictorConfig]):
        super().__init__()
        self.self_attn = Attention(
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
        )
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, past):
        h, kv = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv


class _DecoderStack(nn.Module):
    """Shared forward of ``talker.model`` and ``talker.code_predictor.model``.

    Subclasses define ``layers``, ``norm`` and ``rotary_emb``.
    """

    layers: nn.ModuleList
    norm: RMSNorm
    rotary_emb: RotaryEmbedding

    def forward(
        self, embeds: torch.Tensor, positions: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None
    ) -> Tuple[torch.Tensor, KVCache]:
        """Run the layers on input embeddings.

        embeds ``[B, T, hidden]``; positions ``[B, T]`` int (default: continue after the
        cache, i.e. ``past + arange(T)``); cache from a previous call or None.
        Returns ``(final-norm hidden [B, T, hidden], new cache)``; the input cache is not
        modified in place.
        """
        if embeds.dim() != 3 or embeds.shape[-1] != self.norm.weight.shape[0]:
            raise ValueError(f"embeds must be [B, T, {self.norm.weight.shape[0]}], got {tuple(embeds.shape)}")
        b, t, _ = embeds.shape
        if t == 0:
            raise ValueError("embeds must have at least one position (T >= 1)")
        n_past = 0
        if cache is not None:
            if len(cache) != len(self.layers):
                raise ValueError(f"cache has {len(cache)} layers, the model has {len(self.layers)}")
            if cache[0][0].shape[0] != b:
                raise ValueError(f"cache batch {cache[0][0].shape[0]} != embeds batch {b}")
            n_past = cache[0][0].shape[2]
        if positions is None:
            positions = torch.arange(n_past, n_past + t, device=embeds.device).expand(b, t)
        elif tuple(positions.shape) != (b, t):
            raise ValueError(f"positions must be [B, T] = {(b, t)}, got {tuple(positions.shape)}")
        cos, sin = self.rotary_emb(positions, embeds.dtype)
        x = embeds
        new_cache: KVCache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, None if cache is None else cache[i])
            new_cache.append(kv)
        return self.norm(x), new_cache


class TalkerBackbone(_DecoderStack):
    """``talker.model``: Qwen3 layers, final norm, codec and text embeddings."""

    def __init__(self, c: TalkerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(c.text_vocab_size, c.text_hidden_size)
        self.rotary_emb = RotaryEmbedding(c.head_dim, c.rope_theta)


class TextProjection(nn.Module):
    """``talker.text_projection``: ``fc2(silu(fc1(x)))`` with biases, text width -> talker width."""

    def __init__(self, d_text: int, d: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(d_text, d_text, bias=True)
        self.linear_fc2 = nn.Linear(d_text, d, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class CodePredictorBackbone(_DecoderStack):
    """``talker.code_predictor.model``: layers, norm, and the 15 residual-codebook tables.

    The tables have the *talker* width: they also build the talker's next input (``F(frame)``).
    """

    def __init__(self, c: CodePredictorConfig, talker_hidden: int):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(c.vocab_size, talker_hidden) for _ in range(c.num_code_groups - 1)
        )
        self.rotary_emb = RotaryEmbedding(c.head_dim, c.rope_theta)


class CodePredictor(nn.Module):
    """``talker.code_predictor``: predicts codebooks 1..15 of a frame from ``(h, c0)``.

    ``small_to_mtp_projection`` is a Linear only when the talker and predictor widths differ
    (1.7B); otherwise an Identity, which has no checkpoint keys.
    """

    def __init__(self, c: CodePredictorConfig, talker_hidden: int):
        super().__init__()
        self.config = c
        self.model = CodePredictorBackbone(c, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(c.hidden_size, c.vocab_size, bias=False) for _ in range(c.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, c.hidden_size, bias=True) if talker_hidden != c.hidden_size else nn.Identity()
        )

    @property
    def num_residual(self) -> int:
        return self.config.num_code_groups - 1

    def predict(self, h: torch.Tensor, c0_embed: torch.Tensor, sampler: ResidualSampler) -> torch.Tensor:
        """Residual codes ``[B, 15]`` of one frame.

        h: the talker's final-norm hidden state ``[B, D]`` at the position whose logits gave
        c0; c0_embed: ``C(c0)`` ``[B, D]`` (the talker's codec table, so it is passed in; use
        :meth:`Talker.predict_residuals` to pass ids). ``sampler(j, logits [B, V]) -> [B]``
        picks codebook ``j`` (1..15).

        Steps: a 2-row prefill ``[h, C(c0)]`` at positions 0, 1 -> lm_head[0] -> c1; then for
        j = 2..15 one row ``E_{j-1}(c_{j-1})`` at position j with the KV cache -> lm_head[j-1].
        Every input row goes through ``small_to_mtp_projection``. c15 is never fed back.
        """
        if h.dim() != 2 or c0_embed.shape != h.shape:
            raise ValueError(f"h and c0_embed must both be [B, D]; got {tuple(h.shape)} and {tuple(c0_embed.shape)}")
        x = self.small_to_mtp_projection(torch.stack([h, c0_embed], dim=1))  # [B, 2, Dcp]
        hidden, cache = self.model(x, None, None)  # positions 0, 1
        codes: List[torch.Tensor] = []
        for j in range(1, self.num_residual + 1):
            logits = self.lm_head[j - 1](hidden[:, -1])
            c = sampler(j, logits).reshape(-1).to(torch.long)
            if c.shape[0] != h.shape[0]:
                raise ValueError(f"sampler returned {c.shape[0]} ids for batch {h.shape[0]}")
            codes.append(c)
            if j == self.num_residual:
                break
            e = self.small_to_mtp_projection(self.model.codec_embedding[j - 1](c))[:, None]
            hidden, cache = self.model(e, None, cache)  # position j + 1
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

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def _ids(self, ids: IdsLike, vocab: int, what: str) -> torch.Tensor:
        t = torch.as_tensor(ids, device=self.codec_head.weight.device)
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"{what} ids must be integers, got dtype {t.dtype}")
        t = t.to(torch.long)
        if t.numel() and not t.is_meta and (int(t.min()) < 0 or int(t.max()) >= vocab):
            raise ValueError(f"{what} ids must be in [0, {vocab}), got range [{int(t.min())}, {int(t.max())}]")
        return t

    def embed_text(self, ids: IdsLike) -> torch.Tensor:
        """T(id) = text_projection(text_embedding(id)): ``[...]`` -> ``[..., D]``."""
        ids = self._ids(ids, self.config.text_vocab_size, "text")
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: IdsLike) -> torch.Tensor:
        """C(id) = codec_embedding(id) (codebook 0, specials, CustomVoice speakers): ``[..., D]``."""
        return self.model.codec_embedding(self._ids(ids, self.config.vocab_size, "codec"))

    def embed_frame(self, codes: IdsLike) -> torch.Tensor:
        """F(frame) = C(c0) + sum_{j=1..15} E_j(c_j): ``codes[..., 16]`` -> ``[..., D]``."""
        codes = self._ids(codes, self.config.vocab_size, "frame")
        g = self.config.num_code_groups
        if codes.dim() == 0 or codes.shape[-1] != g:
            raise ValueError(f"codes must be [..., {g}], got {tuple(codes.shape)}")
        cb = self.config.codebook_size
        if codes.numel() and not codes.is_meta and int(codes[..., 1:].max()) >= cb:
            raise ValueError(f"residual codes (codebooks 1..{g - 1}) must be < {cb}")
        out = self.model.codec_embedding(codes[..., 0])
        for j, table in enumerate(self.code_predictor.model.codec_embedding, start=1):
            out = out + table(codes[..., j])
        return out

    def forward(
        self, embeds: torch.Tensor, positions: Optional[torch.Tensor] = None, cache: Optional[KVCache] = None
    ) -> Tuple[torch.Tensor, KVCache]:
        """Backbone over input embeddings ``[B, T, D]``; returns (final-norm hidden ``[B, T, D]``,
        cache). Positions default to continuing after the cache (one frame = one position)."""
        return self.model(embeds, positions, cache)

    def codec_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Codebook-0 logits ``[..., vocab_size]`` (3072: codes, specials, EOS) from hidden states."""
        return self.codec_head(hidden)

    def predict_residuals(self, h: torch.Tensor, c0: torch.Tensor, sampler: ResidualSampler) -> torch.Tensor:
        """Codebooks 1..15 ``[B, 15]`` for hidden ``h [B, D]`` and sampled codebook-0 ids ``c0 [B]``."""
        c0 = self._ids(c0, self.config.vocab_size, "c0").reshape(-1)
        return self.code_predictor.predict(h, self.model.codec_embedding(c0), sampler)


class Qwen3TTSModel(nn.Module):
    """Everything in ``model.safetensors``: ``talker`` and, for Base models, ``speaker_encoder``."""

    def __init__(self, config: Qwen3TTSConfig):
        super().__init__()
        self.config = config
        self.talker = Talker(config.talker)
        self.speaker_encoder: Optional[nn.Module] = None
        if config.speaker_encoder is not None:
            # Lazy: only Base models need it, and it lives in another engineer's module.
            from triton_qwen3_tts.model.speaker_encoder import SpeakerEncoder

            self.speaker_encoder = SpeakerEncoder(config.speaker_encoder)

    @classmethod
    def from_config(
        cls, config: Qwen3TTSConfig, device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None
    ) -> "Qwen3TTSModel":
        """Build on ``device`` (``"meta"``: no memory, for parameter counting or assign-loading)."""
        if not isinstance(config, Qwen3TTSConfig):
            raise TypeError(f"config must be a Qwen3TTSConfig, got {type(config).__name__}")
        if device is None:
            model = cls(config)
        else:
            with torch.device(device):
                model = cls(config)
        return model if dtype is None else model.to(dtype)

    @classmethod
    def on_meta(cls, config: Qwen3TTSConfig) -> "Qwen3TTSModel":
        """Shorthand for ``from_config(config, device="meta")``."""
        return cls.from_config(config, device="meta")


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> nn.Module:
    """Deterministic random weights for tests and random checkpoints.

    Linear and Embedding weights (codec/text embeddings and the 15 residual tables included)
    ~ N(0, std), biases 0, norm weights 1. The speaker encoder, if any, gets its own helper's
    init (fan-in scaled, so random x-vectors stay finite). Works on any ``nn.Module`` containing
    these modules; returns ``model`` for chaining.
    """
    g = torch.Generator().manual_seed(int(seed))
    spk = getattr(model, "speaker_encoder", None)
    skip = {id(p) for p in spk.parameters()} if spk is not None else set()
    for name, p in model.named_parameters():
        if id(p) in skip:
            continue
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.copy_((torch.randn(p.shape, generator=g, dtype=torch.float32) * std).to(p.dtype))
    if spk is not None:
        from triton_qwen3_tts.model.speaker_encoder import init_random_speaker_encoder_weights

        init_random_speaker_encoder_weights(spk, seed)
    return model
