"""Speech-tokenizer decoder (Qwen3-TTS-Tokenizer-12Hz codec) in plain PyTorch.

16-code frames -> 24 kHz audio, 1920 samples per frame, strictly causal. Module names give exactly
the official ``decoder.*`` keys of ``speech_tokenizer/model.safetensors`` (without the prefix), so
the checkpoint loads with ``load_state_dict(strict=True)``. All tensors in the official decoder's
``state_dict`` are parameters (the codebooks' ``embedding_sum``/``cluster_usage`` are
``nn.Parameter`` there too; the RoPE ``inv_freq`` buffer is not persistent), so
``sum(p.numel() for p in parameters())`` == the state-dict total == 114,323,137 at real size.

Numerics follow the official forward (checked against ``qwen-tts==0.1.1`` under
``transformers==4.57.3``: bit-identical to its eager attention, <5e-7 from its SDPA path).

Written to export cleanly to ONNX/TensorRT and to batch:

* the attention mask is built from the sequence length with plain tensor ops (causal, sliding
  window of 72 *including* the current position, which is what HF's ``sliding_window`` means:
  key ``k`` is visible from query ``q`` iff ``0 <= q - k < 72``);
* attention is a manual softmax over an additive mask (no HF mask utilities, no vmap);
* there is no data-dependent Python control flow; every Python branch depends on module
  constants only;
* rows of a batch never mix (no padding, no batch-wide statistics).

Command line: ``python -m triton_qwen3_tts.model.codec --measure-window-error`` measures how far windowed
decoding with a given left context is from whole-utterance decoding (docs/codec_window_error.md).
"""

from __future__ import annotations

import argparse
import math
from typing import Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from triton_qwen3_tts.model.config import CodecDecoderConfig

SAMPLES_PER_FRAME = 1920
CODEBOOK_EPS = 1e-5  # official EuclideanCodebook epsilon: table = sum / clamp(usage, min=eps)


# --------------------------------------------------------------------------------------------
# Convolutions


class CausalConv(nn.Module):
    """Conv1d padded on the left only, so output ``t`` sees inputs ``<= t`` (official rule).

    Left pad ``(k-1)*d + 1 - stride``; right pad only to make the length a multiple of the
    stride. For the official rule that right pad is ``(-L) mod stride`` (it reduces to
    ``ceil(L/s)*s - L``), which is 0 for stride 1 -- the only stride this decoder uses.
    """

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.eff_kernel = (kernel - 1) * dilation + 1
        self.padding = self.eff_kernel - stride  # left pad; for stride 1 = the state length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = 0 if self.stride == 1 else (-x.shape[-1]) % self.stride
        return self.conv(F.pad(x, (self.padding, extra)))


class CausalTransConv(nn.Module):
    """ConvTranspose1d with ``kernel - stride`` samples cut from the right: output is T * stride.

    The cut samples are the not-yet-complete overlap tail, which keeps the layer causal.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.right_pad = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.right_pad] if self.right_pad > 0 else y


class ConvNeXt(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm -> Linear x4 -> GELU -> Linear -> x gamma -> residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class SnakeBeta(nn.Module):
    """``x + 1/(exp(beta) + 1e-9) * sin(exp(alpha) * x)^2`` per channel; alpha, beta stored as logs."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        a = torch.exp(self.alpha)[None, :, None]
        b = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (b + 1e-9)) * torch.sin(x * a).pow(2)


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k7 (dilated) -> SnakeBeta -> conv k1, plus the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    """Vocoder stage: ``block = [SnakeBeta, CausalTransConv(k=2r, s=r), 3 ResidualUnits (d 1,3,9)]``."""

    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)] + [ResidualUnit(cout, d) for d in (1, 3, 9)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x


# --------------------------------------------------------------------------------------------
# Split residual vector quantizer (decode side only)


class _Codebook(nn.Module):
    """Official ``EuclideanCodebook``: both tensors are parameters in the official module."""

    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        """The code vectors ``[size, dim]`` (EMA codebook: running sum / running usage)."""
        return self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPS)[:, None]


class _VQ(nn.Module):
    """Holds ``_codebook`` so that keys read ``vq.layers.N._codebook.*``."""

    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self._codebook = _Codebook(dim, size)


class _RVQLayers(nn.Module):
    def __init__(self, n: int, dim: int, size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(dim, size) for _ in range(n))


class _RVQ(nn.Module):
    """Official ``ResidualVectorQuantizer`` with ``force_projection=True``."""

    def __init__(self, n: int, dim: int, io_dim: int, size: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoding only; kept for the keys
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _RVQLayers(n, dim, size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, n, T]`` -> ``[B, io_dim, T]``: sum of the n code vectors, then output_proj."""
        q: Optional[torch.Tensor] = None
        for i, layer in enumerate(self.vq.layers):
            v = F.embedding(codes[:, i], layer._codebook.table())  # [B, T, dim]
            q = v if q is None else q + v
        assert q is not None
        return self.output_proj(q.transpose(1, 2))


class SplitRVQ(nn.Module):
    """Codebook 0 (semantic) and codebooks 1..15 have separate output projections; summed."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = _RVQ(1, dim, cfg.codebook_dim, cfg.codebook_size)
        self.rvq_rest = _RVQ(cfg.num_quantizers - 1, dim, cfg.codebook_dim, cfg.codebook_size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, 16, T]`` -> ``[B, codebook_dim, T]``."""
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


# --------------------------------------------------------------------------------------------
# Pre-transformer


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, weight applied after casting back (official/HF order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def sliding_window_mask(t: int | torch.Tensor, window: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask ``[t, t]``: 0 where ``0 <= q - k < window``, -inf elsewhere.

    Built from ``arange`` so it traces with a symbolic ``t`` (no HF masking utilities). The
    diagonal is always visible, so no row is fully masked and softmax never sees all -inf.
    """
    pos = torch.arange(t, device=device)
    d = pos[:, None] - pos[None, :]  # query - key
    allowed = (d >= 0) & (d < window)
    return torch.zeros(d.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


class Attention(nn.Module):
    """Multi-head attention, no bias, no QK-norm, rotate-half RoPE; manual softmax in fp32."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        h, hd = cfg.num_attention_heads, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = h, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, h * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:  # config constant (16/16 in the real decoder)
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) * (self.head_dim**-0.5) + mask
        att = torch.softmax(att.float(), dim=-1).to(q.dtype)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, d: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    """Pre-norm block with LayerScale on both residual branches."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    """input_proj -> 8 sliding-window layers -> norm -> output_proj, on ``[B, T, latent]``."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.window = cfg.sliding_window
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        exponent = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
        inv = 1.0 / (cfg.rope_theta**exponent)
        self.register_buffer("inv_freq", inv, persistent=False)  # not in the checkpoint

    def rope(
        self, t: int | torch.Tensor, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[1, 1, t, head_dim]`` for positions 0..t-1 (computed in fp32)."""
        pos = torch.arange(t, device=device).float()
        freqs = pos[:, None] * self.inv_freq.float()[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, latent]
        x = self.input_proj(x)
        t = x.shape[1]
        cos, sin = self.rope(t, x.dtype, x.device)  # positions restart at 0 on every call
        mask = sliding_window_mask(t, self.window, x.dtype, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output_proj(self.norm(x))


# --------------------------------------------------------------------------------------------
# The decoder


class CodecDecoder(nn.Module):
    """The decoder of Qwen3-TTS-Tokenizer-12Hz (official key names, official numerics)."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXt(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        dec: List[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            dec.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        dec += [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(dec)
        self.samples_per_frame = cfg.total_upsample

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, 16, T]`` int64 (official layout) -> audio ``[B, 1, T * 1920]`` in [-1, 1].

        Codes must be in [0, codebook_size); the official wrapper clamps its -1 padding to 0
        before calling this, and so must callers.
        """
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        for stage in self.upsample:
            for m in stage:
                h = m(h)
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1.0, 1.0)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[B, T, 16]`` (frames-major, the service layout) -> ``[B, T * 1920]``."""
        return self.forward(codes.transpose(1, 2))[:, 0]

    def decode_window(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """Decode ``codes [B, T, 16]`` whose first ``left_context`` frames are context only;
        return the new frames' samples ``[B, (T - left_context) * 1920]``.

        Approximate unless ``left_context`` covers the receptive field (docs/codec_window_error.md).
        """
        t = codes.shape[1]
        if isinstance(left_context, bool) or not isinstance(left_context, int) or not 0 <= left_context < t:
            raise ValueError(f"left_context must be an int in [0, {t}), got {left_context!r}")
        return self.decode(codes)[:, left_context * self.samples_per_frame :]

    def decode_official(self, codes: torch.Tensor, chunk: int = 300, context: int = 25) -> torch.Tensor:
        """The official non-streaming ``chunked_decode`` of one utterance:
        ``codes [T, 16] -> [T * 1920]``. 300-frame chunks, each with up to 25 frames of context."""
        c = codes.t()[None]  # [1, 16, T]
        total = c.shape[-1]
        out, start = [], 0
        while start < total:
            end = min(start + chunk, total)
            ctx = context if start - context > 0 else start  # the official rule, verbatim in effect
            out.append(self.forward(c[..., start - ctx : end])[0, 0, ctx * self.samples_per_frame :])
            start = end
        return torch.cat(out)


# --------------------------------------------------------------------------------------------
# Random weights and window-error measurement

AUDIBLE_LAYER_SCALE = 0.1
AUDIBLE_GAMMA = 0.1
WEIGHT_GAIN = 0.78


@torch.no_grad()
def init_random_codec_weights(decoder: CodecDecoder, seed: int = 0, audible: bool = True) -> CodecDecoder:
    """Deterministic random weights that decode to audible noise.

    * ``cluster_usage`` = 1: it divides ``embedding_sum`` after a clamp at 1e-5, so it must be
      positive or the code vectors explode; ``embedding_sum`` ~ N(0, 1).
    * The official init values (LayerScale 0.01, ConvNeXt gamma 1e-6) make the transformer and
      ConvNeXt branches nearly vanish, and with the official small weight std the whole decoder
      is near-silent, which hides bugs. ``audible=True`` (default) sets LayerScale and
      gamma to 0.1 so those branches contribute visibly; ``audible=False`` keeps 0.01 / 1e-6.
      SnakeBeta alpha = beta = 0 (exp = 1) either way.
    * Other weights: N(0, (0.78 / sqrt(fan_in))^2), biases 0, norm weights 1. The gain of the
      vocoder stack grows steeply with the 0.78 factor; it gives output RMS ~0.07 with no
      clipping for both the tiny and the real sizes, where 1.0 saturates the [-1, 1] clamp (and
      amplifies float rounding by orders of magnitude).
    """
    g = torch.Generator().manual_seed(seed)
    for name, p in decoder.named_parameters():
        if name.endswith("cluster_usage"):
            p.fill_(1.0)
        elif name.endswith("embedding_sum"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith(".alpha") or name.endswith(".beta"):
            p.zero_()
        elif name.endswith("layer_scale.scale"):
            p.fill_(AUDIBLE_LAYER_SCALE if audible else decoder.config.layer_scale_initial_scale)
        elif name.endswith("gamma"):
            p.fill_(AUDIBLE_GAMMA if audible else 1e-6)
        elif "norm" in name and name.endswith("weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            fan_in = p[0].numel() if p.dim() > 1 else p.numel()
            p.copy_(torch.randn(p.shape, generator=g) * (WEIGHT_GAIN / math.sqrt(max(fan_in, 1))))
    return decoder


@torch.no_grad()
def measure_window_error(
    decoder: CodecDecoder, codes: torch.Tensor, contexts: Iterable[int], new_frames: int = 25
) -> Dict[int, float]:
    """Max-abs error of windowed decoding against whole-utterance decoding.

    The last ``new_frames`` frames of ``codes [T, 16]`` are decoded once with the whole
    utterance and once per ``ctx`` in ``contexts`` with only ``ctx`` frames of left context
    (fewer if the utterance is shorter); returns ``{ctx: max |window - whole|}``.
    """
    t = codes.shape[0]
    if not 0 < new_frames <= t:
        raise ValueError(f"new_frames must be in (0, {t}], got {new_frames}")
    spf = decoder.samples_per_frame
    start = t - new_frames
    ref = decoder.decode(codes[None])[0, start * spf :]
    out: Dict[int, float] = {}
    for ctx in contexts:
        c0 = max(0, start - int(ctx))
        win = decoder.decode_window(codes[None, c0:], start - c0)[0]
        out[int(ctx)] = float((win - ref).abs().max())
    return out


DEFAULT_CONTEXTS = (0, 25, 48, 72, 96, 144)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: ``--measure-window-error`` on a random decoder of a preset."""
    from triton_qwen3_tts.model import presets

    p = argparse.ArgumentParser(description="Codec decoder utilities")
    p.add_argument(
        "--measure-window-error",
        action="store_true",
        help="print max-abs error of windowed vs whole decode per left context",
    )
    p.add_argument("--preset", default="tiny", help="presets.speech_tokenizer_config name")
    p.add_argument("--frames", type=int, default=300, help="utterance length in frames")
    p.add_argument("--new-frames", type=int, default=25, help="frames compared at the end")
    p.add_argument("--contexts", type=int, nargs="+", default=list(DEFAULT_CONTEXTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="weights+codes seeds")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--official-init",
        action="store_true",
        help="LayerScale 0.01 / gamma 1e-6 (the official init values) instead of 0.1 / 0.1",
    )
    a = p.parse_args(argv)
    if not a.measure_window_error:
        p.print_help()
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on GPUs too
    torch.backends.cudnn.allow_tf32 = False
    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(a.preset)["decoder_config"])
    print(
        f"preset={a.preset} layers={cfg.num_hidden_layers} window={cfg.sliding_window} "
        f"frames={a.frames} new_frames={a.new_frames} device={a.device} "
        f"init={'official' if a.official_init else 'audible'}"
    )
    for seed in a.seeds:
        dec = init_random_codec_weights(CodecDecoder(cfg), seed, audible=not a.official_init)
        dec = dec.eval().to(a.device)
        gen = torch.Generator().manual_seed(seed)
        codes = torch.randint(0, cfg.codebook_size, (a.frames, cfg.num_quantizers), generator=gen)
        codes = codes.to(a.device)
        with torch.no_grad():
            rms = float(dec.decode(codes[None]).pow(2).mean().sqrt())
        print(f"seed={seed} whole-utterance output rms={rms:.3e}")
        errs = measure_window_error(dec, codes, a.contexts, a.new_frames)
        for ctx, err in errs.items():
            print(f"seed={seed} left_context={ctx:4d}  max_abs_error={err:.3e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
