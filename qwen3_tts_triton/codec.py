"""Speech-tokenizer decoder (Qwen3-TTS-Tokenizer-12Hz codec) in plain PyTorch (spec section 5).

16-code frames -> 24 kHz audio, 1920 samples per frame, strictly causal. Module names give exactly
the official ``decoder.*`` keys of ``speech_tokenizer/model.safetensors`` (without the prefix).

Written to export cleanly to ONNX/TensorRT and to batch: the attention mask is built from shapes
with plain tensor ops (causal, sliding window of 72 including the current position, as HF's
``sliding_window`` means), there is no data-dependent Python control flow, and every row of a
batch is independent of the others.

Command line: ``python -m qwen3_tts_triton.codec --measure-window-error`` measures how far windowed
decoding with a given left context is from whole-utterance decoding (docs/codec_window_error.md).
"""

from __future__ import annotations

import argparse
import math
from typing import Dict, Iterable, List

import torch
import torch.nn.functional as F
from torch import nn

from .config import CodecDecoderConfig

SAMPLES_PER_FRAME = 1920


class CausalConv(nn.Module):
    """Conv1d with left padding (k-1)*d + 1 - stride and right padding to align to the stride."""

    def __init__(self, cin, cout, kernel, dilation=1, stride=1, groups=1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.eff_kernel = (kernel - 1) * dilation + 1
        self.padding = self.eff_kernel - stride

    def forward(self, x):
        length = x.shape[-1]
        if self.stride == 1:
            extra = 0  # (stride 1: the official alignment rule always gives 0)
        else:
            n = (length - self.eff_kernel + self.padding) / self.stride + 1
            extra = (math.ceil(n) - 1) * self.stride + (self.eff_kernel - self.padding) - length
        return self.conv(F.pad(x, (self.padding, extra)))


class CausalTransConv(nn.Module):
    """ConvTranspose1d with ``kernel - stride`` samples cut from the right: output is T * stride."""

    def __init__(self, cin, cout, kernel, stride):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.right_pad = kernel - stride

    def forward(self, x):
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.right_pad] if self.right_pad > 0 else y


class ConvNeXt(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x):
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta) + 1e-9) * sin(exp(alpha) * x)^2, per channel; alpha, beta stored as logs."""

    def __init__(self, dim):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        a = torch.exp(self.alpha)[None, :, None]
        b = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (b + 1e-9)) * torch.sin(x * a).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim, dilation):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x):
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin, cout, rate):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
                                   + [ResidualUnit(cout, d) for d in (1, 3, 9)])

    def forward(self, x):
        for m in self.block:
            x = m(x)
        return x


class _Codebook(nn.Module):
    def __init__(self, dim, size):
        super().__init__()
        # Parameters in the official module (so they count in its parameter total).
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self):
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, dim, size):
        super().__init__()
        self._codebook = _Codebook(dim, size)


class _RVQLayers(nn.Module):
    def __init__(self, n, dim, size):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(dim, size) for _ in range(n))


class _RVQ(nn.Module):
    def __init__(self, n, dim, io_dim, size):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoding only; kept for the keys
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _RVQLayers(n, dim, size)

    def decode(self, codes):  # codes [B, n, T] -> [B, io_dim, T]
        q = 0
        for i, layer in enumerate(self.vq.layers):
            q = q + F.embedding(codes[:, i], layer._codebook.table())  # [B, T, dim]
        return self.output_proj(q.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = _RVQ(1, dim, cfg.codebook_dim, cfg.codebook_size)
        self.rvq_rest = _RVQ(cfg.num_quantizers - 1, dim, cfg.codebook_dim, cfg.codebook_size)

    def decode(self, codes):
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LayerScale(nn.Module):
    def __init__(self, dim, init):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x):
        return self.scale * x


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        h, hd = cfg.num_attention_heads, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = h, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(cfg.hidden_size, h * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) * (self.head_dim ** -0.5) + mask
        att = torch.softmax(att.float(), dim=-1).to(q.dtype)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.window = cfg.sliding_window
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self._rope = (cfg.rope_theta, cfg.head_dim)
        self.register_buffer("inv_freq", self._inv_freq(torch.device("cpu")), persistent=False)

    def _inv_freq(self, device):
        theta, hd = self._rope
        return 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))

    def _apply(self, fn, recurse=True):
        # .to(bfloat16) would round the rotary frequencies; keep them float32 on every move.
        super()._apply(fn, recurse)
        if self.inv_freq.device.type != "meta":
            self.inv_freq = self._inv_freq(self.inv_freq.device)
        return self

    def forward(self, x):  # [B, T, latent]
        x = self.input_proj(x)
        t = x.shape[1]
        pos = torch.arange(t, device=x.device)  # positions restart at 0 on every call
        freqs = pos.float()[:, None] * self.inv_freq.float()[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[None, None], emb.sin().to(x.dtype)[None, None]
        d = pos[:, None] - pos[None, :]  # query - key
        allowed = (d >= 0) & (d < self.window)
        mask = torch.zeros(t, t, dtype=x.dtype, device=x.device).masked_fill(~allowed, float("-inf"))
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output_proj(self.norm(x))


class CodecDecoder(nn.Module):
    """The decoder of Qwen3-TTS-Tokenizer-12Hz (official key names)."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitRVQ(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = PreTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXt(cfg.latent_dim)])
            for r in cfg.upsampling_ratios)
        dec: List[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            dec.append(DecoderBlock(cfg.decoder_dim // 2 ** i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        dec += [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(dec)
        self.samples_per_frame = cfg.total_upsample

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] (official layout) -> audio [B, 1, T * 1920] in [-1, 1]."""
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h.transpose(1, 2)).transpose(1, 2)
        for stage in self.upsample:
            for m in stage:
                h = m(h)
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1.0, 1.0)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, 16] (frames-major, the service layout) -> [B, T * 1920]."""
        return self.forward(codes.transpose(1, 2))[:, 0]

    def decode_window(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """Decode ``codes [B, T, 16]`` whose first ``left_context`` frames are context; return only
        the new frames' samples ``[B, (T - left_context) * 1920]``."""
        t = codes.shape[1]
        if not (isinstance(left_context, int) and 0 <= left_context < t):
            raise ValueError(f"left_context must be an int in [0, {t}), got {left_context!r}")
        return self.decode(codes)[:, left_context * self.samples_per_frame:]

    def decode_official(self, codes: torch.Tensor, chunk: int = 300, context: int = 25) -> torch.Tensor:
        """The official non-streaming decode of one utterance (spec 5.4): ``codes [T, 16] -> [T*1920]``."""
        c = codes.t()[None]  # [1, 16, T]
        out, start = [], 0
        while start < c.shape[-1]:
            end = min(start + chunk, c.shape[-1])
            ctx = context if start - context > 0 else start
            out.append(self.forward(c[..., start - ctx:end])[0, 0, ctx * self.samples_per_frame:])
            start = end
        return torch.cat(out)


@torch.no_grad()
def init_random_codec_weights(decoder: CodecDecoder, seed: int = 0, audible: bool = True) -> CodecDecoder:
    """Deterministic random weights. ``cluster_usage`` = 1 (must be positive, spec 7.2) and
    ``embedding_sum`` ~ N(0, 1). With the official init (LayerScale 0.01, ConvNeXt gamma 1e-6,
    SnakeBeta 0) a random decoder is near-silent; ``audible`` raises LayerScale and gamma to 0.1 so
    tests and listening checks see real signal (RMS about 0.07, no clipping)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in decoder.named_parameters():
        if name.endswith("cluster_usage"):
            p.fill_(1.0)
        elif name.endswith("embedding_sum"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith(".alpha") or name.endswith(".beta"):
            p.zero_()
        elif name.endswith("layer_scale.scale"):
            p.fill_(0.1 if audible else decoder.config.layer_scale_initial_scale)
        elif name.endswith("gamma"):
            p.fill_(0.1 if audible else 1e-6)
        elif "norm" in name and name.endswith("weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            # 0.78 / sqrt(fan_in): the gain of the vocoder stack grows steeply with this factor;
            # 0.78 gives output RMS ~0.07 with no clipping for both the tiny and the real sizes,
            # where 1.0 saturates the clamp (and amplifies float rounding by orders of magnitude).
            fan_in = p[0].numel() if p.dim() > 1 else p.numel()
            p.copy_(torch.randn(p.shape, generator=g) * (0.78 / math.sqrt(max(fan_in, 1))))
    return decoder


@torch.no_grad()
def measure_window_error(decoder: CodecDecoder, codes: torch.Tensor, contexts: Iterable[int],
                         new_frames: int = 25) -> Dict[int, float]:
    """Max-abs error of decoding the last ``new_frames`` frames of ``codes [T, 16]`` with
    ``ctx`` frames of left context, against the whole-utterance decode."""
    full = decoder.decode(codes[None])[0]
    t = codes.shape[0]
    start = t - new_frames
    ref = full[start * decoder.samples_per_frame:]
    out = {}
    for ctx in contexts:
        c0 = max(0, start - ctx)
        win = decoder.decode_window(codes[None, c0:], start - c0)[0]
        out[ctx] = float((win - ref).abs().max())
    return out


def main(argv=None) -> int:
    from . import presets

    p = argparse.ArgumentParser(description="Codec decoder utilities")
    p.add_argument("--measure-window-error", action="store_true")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--contexts", type=int, nargs="+", default=[0, 25, 48, 72, 96, 144, 200])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.measure_window_error:
        cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(a.preset)["decoder_config"])
        dec = init_random_codec_weights(CodecDecoder(cfg), a.seed).eval()
        codes = torch.randint(0, cfg.codebook_size, (a.frames, 16), generator=torch.Generator().manual_seed(a.seed))
        for ctx, err in measure_window_error(dec, codes, a.contexts).items():
            print(f"left_context={ctx:4d}  max_abs_error={err:.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
