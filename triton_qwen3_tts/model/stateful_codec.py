"""Stateful streaming codec decoder: decodes only the NEW frames, exactly.

``StatefulCodecDecoder(decoder)`` wraps a :class:`~triton_qwen3_tts.model.codec.CodecDecoder` (same
parameter tensors, no copies) and decodes a stream chunk by chunk::

    sd = StatefulCodecDecoder(decoder)
    state = sd.init_state(batch, device, dtype)          # all zeros
    audio, state = sd.step(codes, state)                 # codes [B, T, 16] -> [B, T * 1920]

Concatenating the chunks' audio equals ``decoder.decode`` of the whole utterance (up to float
rounding, ~1e-7 in fp32), for any chunk sizes, because the decoder is strictly causal
and the state carries exactly what the next frames read from the past:

* each causal conv (stride 1, effective kernel ``e = (k-1)*d+1``): its last ``e-1`` input samples
  (zeros at the start == the zero left padding of the whole decode);
* each causal transposed conv (kernel ``K``, stride ``s``, right tail cut): its last
  ``ceil(K/s)-1`` input frames. Output block ``m`` of a ConvTranspose1d with ``K = 2s`` is
  ``b + x[m]·W[:, :, :s] + x[m-1]·W[:, :, s:]``; the ``x[m-1]`` term is the "overlap" spilled
  from the previous frame. The whole decode cuts that spill only after the LAST frame; inside a
  stream it belongs to the next chunk's first block. Carrying the previous input frame and
  re-running the transposed conv on ``[x_prev, x]`` (then dropping the first ``s`` outputs and the
  right tail) recomputes that overlap with the same products as the whole decode, and is smaller
  than carrying the partial sums (``cin`` vs ``cout * s`` values). Kernel == stride (the ×2
  upsample stages) needs no state;
* each pre-transformer attention layer: the post-RoPE keys and the values of the last
  ``window-1`` (71) positions, as a shift buffer in position order (slot ``j`` holds absolute
  position ``pos - (window-1) + j``), plus one position counter per stream. RoPE is applied at
  absolute positions ``pos + i`` (the whole decode numbers positions from 0), and the mask allows
  a key iff ``0 <= q_pos - k_pos < window`` and ``k_pos >= 0`` (the ring validity: a stream at
  position ``pos`` has ``min(pos, window-1)`` valid cached frames).

Every state tensor has a fixed shape ``[B, ...]`` (no data-dependent shapes), and every row of a
batch is independent: streams at different positions can be batched in one ``step`` as long as
they advance by the same number of frames ``T`` in that call.

``StatefulCodecDecoder(decoder, channels_last=True)`` runs the vocoder on channels-last tensors
(the same arithmetic and state; the comment above ``_snake4``): the GPU serving default
(``codec_channels_last``); the export keeps the reference layout.

For a stateless Triton/ONNX model the state is passed explicitly: :meth:`flatten_state` /
:meth:`unflatten_state` convert to and from a list in the fixed order of :meth:`state_names`
(ONNX names ``state_in_<name>`` / ``state_out_<name>``, see :meth:`onnx_state_names`).

:func:`bench_modes` times windowed decoding (``context + chunk`` frames per call) against
stateful decoding (``chunk`` frames per call). Layout and sizes: docs/design/stateful-codec.md.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from triton_qwen3_tts.model.codec import (
    Attention,
    CausalConv,
    CausalTransConv,
    CodecDecoder,
    ConvNeXt,
    DecoderBlock,
    ResidualUnit,
    SnakeBeta,
    TransformerLayer,
    _rotate_half,
)

POS_NAME = "pos"
State = "OrderedDict[str, torch.Tensor]"


# --------------------------------------------------------------------------------------------
# Streaming versions of the stateful building blocks (they use the wrapped modules' weights).


def _conv_state_len(cc: CausalConv) -> int:
    if cc.stride != 1:
        raise NotImplementedError("stateful decode supports stride-1 causal convs only (the decoder has no other)")
    return cc.padding  # eff_kernel - 1


def _conv_step(cc: CausalConv, x: torch.Tensor, past: Optional[torch.Tensor]):
    """Causal conv of the new samples ``x [B, C, T]`` given the last ``eff_kernel-1`` inputs."""
    if past is None:
        return cc.conv(x), None
    xx = torch.cat([past, x], dim=-1)
    return cc.conv(xx), xx[..., xx.shape[-1] - cc.padding :]


def _trans_state_len(tc: CausalTransConv) -> int:
    k, s = tc.conv.kernel_size[0], tc.conv.stride[0]
    return -(-k // s) - 1  # input frames whose kernel reaches past their own stride block


def _trans_step(tc: CausalTransConv, x: torch.Tensor, past: Optional[torch.Tensor]):
    """Causal transposed conv of ``x [B, C, T]`` -> ``[B, C', T * stride]`` given the last inputs."""
    s = tc.conv.stride[0]
    t = x.shape[-1]
    if past is None:
        return tc.conv(x)[..., : t * s], None
    n = past.shape[-1]
    xx = torch.cat([past, x], dim=-1)
    y = tc.conv(xx)[..., n * s : n * s + t * s]
    return y, xx[..., xx.shape[-1] - n :]


# The vocoder on channels-last tensors: each ``[B, C, L]`` activation as a 4-D ``[B, C, 1, L]`` in
# ``torch.channels_last`` memory (``[B, L, C]`` in memory), its convolutions as ``conv2d`` with a
# height-1 kernel. cuDNN's convolutions run in that layout (NHWC): on a ``[B, C, L]`` tensor each
# ``conv1d`` pays a transpose to NHWC and back around the kernel, and ``torch.compile``'s elementwise
# kernels between them (SnakeBeta, residual adds, the state concatenations) read one layout and
# write the other. Same arithmetic; the state keeps its ``[B, C, n]`` shapes.


def _snake4(m: SnakeBeta, x: torch.Tensor) -> torch.Tensor:
    """SnakeBeta of a ``[B, C, 1, L]`` tensor (``SnakeBeta.forward``'s arithmetic)."""
    a = torch.exp(m.alpha)[None, :, None, None]
    b = torch.exp(m.beta)[None, :, None, None]
    return x + (1.0 / (b + 1e-9)) * torch.sin(x * a).pow(2)


def _past4(past: torch.Tensor) -> torch.Tensor:
    """A ``[B, C, n]`` state as ``[B, C, 1, n]`` channels-last, ready to concatenate."""
    return past.unsqueeze(2).contiguous(memory_format=torch.channels_last)


def _conv_step4(cc: CausalConv, x: torch.Tensor, past: Optional[torch.Tensor]):
    """:func:`_conv_step` on ``[B, C, 1, L]`` channels-last tensors; the new state ``[B, C, n]``."""
    w = cc.conv.weight.unsqueeze(2)
    dil = (1, cc.conv.dilation[0])
    if past is None:
        return F.conv2d(x, w, cc.conv.bias, dilation=dil, groups=cc.conv.groups), None
    xx = torch.cat([_past4(past), x], dim=3)
    y = F.conv2d(xx, w, cc.conv.bias, dilation=dil, groups=cc.conv.groups)
    return y, xx[:, :, 0, xx.shape[-1] - cc.padding :].contiguous()


def _trans_step4(tc: CausalTransConv, x: torch.Tensor, past: Optional[torch.Tensor]):
    """:func:`_trans_step` on ``[B, C, 1, L]`` channels-last tensors; the new state ``[B, C, n]``."""
    s = tc.conv.stride[0]
    t = x.shape[-1]
    w = tc.conv.weight.unsqueeze(2)
    if past is None:
        return F.conv_transpose2d(x, w, tc.conv.bias, stride=(1, s))[..., : t * s], None
    n = past.shape[-1]
    xx = torch.cat([_past4(past), x], dim=3)
    y = F.conv_transpose2d(xx, w, tc.conv.bias, stride=(1, s))[..., n * s : n * s + t * s]
    return y, xx[:, :, 0, xx.shape[-1] - n :].contiguous()


def _attn_step(attn: Attention, x, cos, sin, mask, k_past, v_past):
    """One attention layer over the new frames ``x [B, T, D]`` with the cached post-RoPE keys and
    values ``[B, kv_heads, W-1, hd]``. Same arithmetic as ``Attention.forward``."""
    b, t, _ = x.shape
    q = attn.q_proj(x).view(b, t, attn.heads, attn.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    kk = torch.cat([k_past, k], dim=2)
    vv = torch.cat([v_past, v], dim=2)
    keep = k_past.shape[2]
    k_new, v_new = kk[:, :, kk.shape[2] - keep :], vv[:, :, vv.shape[2] - keep :]
    if attn.kv_heads != attn.heads:
        rep = attn.heads // attn.kv_heads
        kk, vv = kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1)
    att = (q @ kk.transpose(-1, -2)) * (attn.head_dim**-0.5) + mask
    att = torch.softmax(att.float(), dim=-1).to(q.dtype)
    out = attn.o_proj((att @ vv).transpose(1, 2).reshape(b, t, attn.heads * attn.head_dim))
    return out, k_new, v_new


class StatefulCodecDecoder(nn.Module):
    """Exact chunk-by-chunk decoding with explicit per-stream state (module docstring)."""

    def __init__(self, decoder: CodecDecoder, channels_last: bool = False):
        super().__init__()
        self.decoder = decoder  # registered submodule: shares (does not copy) the parameters
        # the vocoder on channels-last tensors (``_conv_step4``; codec_channels_last); the export
        # keeps the reference layout
        self.channels_last = bool(channels_last)
        cfg = decoder.config
        self.window = int(cfg.sliding_window)
        self.kv_len = self.window - 1
        self.samples_per_frame = decoder.samples_per_frame
        self._specs = self._build_specs()

    # ---- state layout ------------------------------------------------------------------------

    def _build_specs(self) -> "OrderedDict[str, Tuple[Tuple[int, ...], bool]]":
        """name -> (shape without batch, is_float). Fixed order == flatten order."""
        d, cfg = self.decoder, self.decoder.config
        specs: "OrderedDict[str, Tuple[Tuple[int, ...], bool]]" = OrderedDict()

        def conv(name, cc: CausalConv):
            n = _conv_state_len(cc)
            if n > 0:
                specs[name] = ((cc.conv.in_channels, n), True)

        def trans(name, tc: CausalTransConv):
            n = _trans_state_len(tc)
            if n > 0:
                specs[name] = ((tc.conv.in_channels, n), True)

        conv("pre_conv", d.pre_conv)
        specs[POS_NAME] = ((), False)
        for i, _ in enumerate(d.pre_transformer.layers):
            shape = (cfg.num_key_value_heads, self.kv_len, cfg.head_dim)
            specs[f"attn.{i}.k"] = (shape, True)
            specs[f"attn.{i}.v"] = (shape, True)
        for i, (tc, nx) in enumerate(d.upsample):
            trans(f"upsample.{i}.trans", tc)
            conv(f"upsample.{i}.dwconv", nx.dwconv)
        for i, m in enumerate(d.decoder):
            if isinstance(m, CausalConv):
                conv(f"decoder.{i}.conv", m)
            elif isinstance(m, DecoderBlock):
                trans(f"decoder.{i}.trans", m.block[1])
                for j, ru in enumerate(m.block[2:]):
                    conv(f"decoder.{i}.res{j}.conv1", ru.conv1)
                    conv(f"decoder.{i}.res{j}.conv2", ru.conv2)
        return specs

    def state_names(self) -> List[str]:
        return list(self._specs)

    def onnx_state_names(self) -> Tuple[List[str], List[str]]:
        """(``state_in_*`` names, ``state_out_*`` names), in flatten order; dots become ``_``."""
        base = [n.replace(".", "_") for n in self._specs]
        return [f"state_in_{n}" for n in base], [f"state_out_{n}" for n in base]

    def state_shapes(self, batch: int = 1) -> "OrderedDict[str, Tuple[int, ...]]":
        return OrderedDict((n, (batch,) + s) for n, (s, _) in self._specs.items())

    def state_bytes_per_stream(self, dtype: torch.dtype = torch.float32) -> int:
        fsize = torch.empty((), dtype=dtype).element_size()
        total = 0
        for shape, is_float in self._specs.values():
            numel = 1
            for x in shape:
                numel *= x
            total += numel * (fsize if is_float else 8)
        return total

    def init_state(
        self, batch: int, device=None, dtype: torch.dtype = torch.float32
    ) -> "OrderedDict[str, torch.Tensor]":
        """All-zero state of ``batch`` streams at position 0 (float tensors in ``dtype``, ``pos`` int64)."""
        return OrderedDict(
            (n, torch.zeros((batch,) + s, device=device, dtype=dtype if f else torch.int64))
            for n, (s, f) in self._specs.items()
        )

    def flatten_state(self, state) -> List[torch.Tensor]:
        missing = [n for n in self._specs if n not in state]
        if missing:
            raise KeyError(f"state lacks {missing}")
        return [state[n] for n in self._specs]

    def unflatten_state(self, tensors: Sequence[torch.Tensor]) -> "OrderedDict[str, torch.Tensor]":
        if len(tensors) != len(self._specs):
            raise ValueError(f"expected {len(self._specs)} state tensors, got {len(tensors)}")
        return OrderedDict(zip(self._specs, tensors))

    # ---- decoding ----------------------------------------------------------------------------

    def _transformer_step(self, x, state, new):  # x [B, T, latent]
        pt = self.decoder.pre_transformer
        x = pt.input_proj(x)
        t = x.shape[1]
        pos0 = state[POS_NAME]  # [B] int64
        steps = torch.arange(t, device=x.device, dtype=torch.int64)
        qpos = pos0[:, None] + steps[None, :]  # [B, T] absolute positions
        freqs = qpos.float()[..., None] * pt.inv_freq.float()[None, None]  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]  # [B, 1, T, hd]
        # keys: kv_len cached slots (positions pos0 - kv_len + j) then the T new ones
        kslot = torch.arange(self.kv_len + t, device=x.device, dtype=torch.int64)
        kpos = pos0[:, None] + kslot[None, :] - self.kv_len  # [B, kv_len + T]
        dpos = qpos[:, :, None] - kpos[:, None, :]  # [B, T, kv_len + T]
        allowed = (dpos >= 0) & (dpos < self.window) & (kpos[:, None, :] >= 0)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill(~allowed, float("-inf"))
        mask = mask[:, None]  # [B, 1, T, kv_len + T]
        for i, layer in enumerate(pt.layers):
            layer: TransformerLayer
            a, k_new, v_new = _attn_step(
                layer.self_attn, layer.input_layernorm(x), cos, sin, mask, state[f"attn.{i}.k"], state[f"attn.{i}.v"]
            )
            new[f"attn.{i}.k"], new[f"attn.{i}.v"] = k_new, v_new
            x = x + layer.self_attn_layer_scale(a)
            x = x + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(x)))
        new[POS_NAME] = pos0 + t
        return pt.output_proj(pt.norm(x))

    def _conv(self, name, cc, x, state, new):
        y, s = _conv_step(cc, x, state.get(name))
        if s is not None:
            new[name] = s
        return y

    def _trans(self, name, tc, x, state, new):
        y, s = _trans_step(tc, x, state.get(name))
        if s is not None:
            new[name] = s
        return y

    def _vocoder(self, h, state, new):  # [B, latent, 4 T] (after the upsample stages) -> [B, 1, 1920 T]
        for i, m in enumerate(self.decoder.decoder):
            if isinstance(m, CausalConv):
                h = self._conv(f"decoder.{i}.conv", m, h, state, new)
            elif isinstance(m, DecoderBlock):
                h = m.block[0](h)  # SnakeBeta
                h = self._trans(f"decoder.{i}.trans", m.block[1], h, state, new)
                for j, ru in enumerate(m.block[2:]):
                    ru: ResidualUnit
                    r = self._conv(f"decoder.{i}.res{j}.conv1", ru.conv1, ru.act1(h), state, new)
                    r = self._conv(f"decoder.{i}.res{j}.conv2", ru.conv2, ru.act2(r), state, new)
                    h = h + r
            else:  # SnakeBeta (pointwise)
                h = m(h)
        return h

    def _vocoder4(self, h, state, new):
        """:meth:`_vocoder` on channels-last ``[B, C, 1, L]`` tensors (the comment above ``_snake4``)."""

        def conv(name, cc, x, step=_conv_step4):
            y, s = step(cc, x, state.get(name))
            if s is not None:
                new[name] = s
            return y

        h = h.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        for i, m in enumerate(self.decoder.decoder):
            if isinstance(m, CausalConv):
                h = conv(f"decoder.{i}.conv", m, h)
            elif isinstance(m, DecoderBlock):
                h = conv(f"decoder.{i}.trans", m.block[1], _snake4(m.block[0], h), _trans_step4)
                for j, ru in enumerate(m.block[2:]):
                    r = conv(f"decoder.{i}.res{j}.conv1", ru.conv1, _snake4(ru.act1, h))
                    h = h + conv(f"decoder.{i}.res{j}.conv2", ru.conv2, _snake4(ru.act2, r))
            else:  # SnakeBeta (pointwise)
                h = _snake4(m, h)
        return h[:, :, 0]

    def step(self, codes: torch.Tensor, state) -> Tuple[torch.Tensor, "OrderedDict[str, torch.Tensor]"]:
        """Decode the next ``T`` frames ``codes [B, T, 16]`` of ``B`` streams -> (audio ``[B, T*1920]``,
        new state). ``state`` is not modified."""
        d = self.decoder
        new: Dict[str, torch.Tensor] = {}
        h = d.quantizer.decode(codes.transpose(1, 2))  # [B, codebook_dim, T]
        h = self._conv("pre_conv", d.pre_conv, h, state, new)
        h = self._transformer_step(h.transpose(1, 2), state, new).transpose(1, 2)
        for i, (tc, nx) in enumerate(d.upsample):
            h = self._trans(f"upsample.{i}.trans", tc, h, state, new)
            nx: ConvNeXt
            g = self._conv(f"upsample.{i}.dwconv", nx.dwconv, h, state, new).transpose(1, 2)
            g = nx.pwconv2(F.gelu(nx.pwconv1(nx.norm(g))))
            h = h + (nx.gamma * g).transpose(1, 2)
        h = self._vocoder4(h, state, new) if self.channels_last else self._vocoder(h, state, new)
        audio = h.clamp(-1.0, 1.0)[:, 0]
        return audio, OrderedDict((n, new[n]) for n in self._specs)

    def forward(self, codes: torch.Tensor, *state_tensors: torch.Tensor):
        """Flat-I/O form for export: ``(codes, *state_in) -> (audio, *state_out)``."""
        audio, new = self.step(codes, self.unflatten_state(state_tensors))
        return (audio, *self.flatten_state(new))

    @torch.no_grad()
    def decode_chunks(self, codes: torch.Tensor, chunks: Sequence[int]) -> torch.Tensor:
        """Decode ``codes [B, T, 16]`` in the given chunk sizes (must sum to T) -> ``[B, T*1920]``."""
        if sum(chunks) != codes.shape[1]:
            raise ValueError(f"chunks sum to {sum(chunks)}, codes have {codes.shape[1]} frames")
        p = next(self.decoder.parameters())
        state = self.init_state(codes.shape[0], p.device, p.dtype)
        out, start = [], 0
        for c in chunks:
            a, state = self.step(codes[:, start : start + c], state)
            out.append(a)
            start += c
        return torch.cat(out, dim=1)


# --------------------------------------------------------------------------------------------
# Benchmark helper


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def bench_modes(
    decoder: CodecDecoder,
    batch_sizes: Sequence[int],
    chunk: int = 25,
    context: int = 72,
    device=None,
    warmup: int = 2,
    iters: int = 5,
    seed: int = 0,
) -> Dict[int, Dict[str, float]]:
    """Time windowed decoding (``context + chunk`` frames per call, the ``chunk`` new ones count)
    against stateful decoding (``chunk`` frames per call, state carried) for each batch size.

    Returns ``{B: {"windowed_ms", "windowed_audio_s_per_s", "stateful_ms", "stateful_audio_s_per_s",
    "speedup"}}``; audio-seconds are NEW audio summed over the batch rows (24 kHz, 1920 samples
    per frame). The median of ``iters`` timed calls after ``warmup`` calls; on CUDA the device is
    synchronised around each call. The decoder's own device and dtype are used unless ``device``
    is given (then it is moved there)."""
    p = next(decoder.parameters())
    if device is not None:
        decoder = decoder.to(device)
        p = next(decoder.parameters())
    dev, dtype = p.device, p.dtype
    sd = StatefulCodecDecoder(decoder)
    spf = decoder.samples_per_frame
    size = decoder.config.codebook_size
    g = torch.Generator().manual_seed(seed)
    results: Dict[int, Dict[str, float]] = {}

    def timed(fn) -> float:
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(iters):
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return ts[len(ts) // 2]

    for b in batch_sizes:
        win_codes = torch.randint(0, size, (b, context + chunk, 16), generator=g).to(dev)
        new_codes = torch.randint(0, size, (b, chunk, 16), generator=g).to(dev)
        # a realistic state: streams already `context` frames in (ring full when context >= 71)
        state = sd.init_state(b, dev, dtype)
        if context > 0:
            _, state = sd.step(win_codes[:, :context], state)
        t_win = timed(lambda: decoder.decode(win_codes))
        t_st = timed(lambda: sd.step(new_codes, state))
        audio_s = b * chunk * spf / 24000.0
        results[b] = {
            "windowed_ms": t_win * 1e3,
            "windowed_audio_s_per_s": audio_s / t_win,
            "stateful_ms": t_st * 1e3,
            "stateful_audio_s_per_s": audio_s / t_st,
            "speedup": t_win / t_st,
        }
    return results


def main(argv=None) -> int:
    import argparse

    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig

    ap = argparse.ArgumentParser(description="Stateful codec decoder: state size and benchmark")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--chunk", type=int, default=25)
    ap.add_argument("--context", type=int, default=72)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument(
        "--check-frames",
        type=int,
        default=0,
        help="first check chunked (mixed chunks) == whole decode on this many frames",
    )
    ap.add_argument("--no-tf32", action="store_true", help="disable TF32 in cuDNN/matmul (exactness check)")
    a = ap.parse_args(argv)
    if a.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(a.preset)["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(cfg), 0).eval()
    inv_freq = dec.pre_transformer.inv_freq.clone()
    dec = dec.to(a.device, getattr(torch, a.dtype))
    dec.pre_transformer.inv_freq = inv_freq.to(a.device)  # keep RoPE frequencies fp32 (as qwen_tts does)
    sd = StatefulCodecDecoder(dec)
    print(
        f"preset={a.preset} state tensors={len(sd.state_names())} "
        f"bytes/stream={sd.state_bytes_per_stream(getattr(torch, a.dtype))}"
    )
    if a.check_frames:
        c = torch.randint(0, cfg.codebook_size, (2, a.check_frames, 16), generator=torch.Generator().manual_seed(1))
        c = c.to(a.device)
        with torch.no_grad():
            full = dec.decode(c)
        pat, sched = [1, 2, 4, 8, 16, 25, 25, 71, 72], []
        while sum(sched) < a.check_frames:
            sched.append(min(pat[len(sched) % len(pat)], a.check_frames - sum(sched)))
        for name, sc in (
            ("25s", [25] * (a.check_frames // 25) + ([a.check_frames % 25] if a.check_frames % 25 else [])),
            ("mixed", sched),
        ):
            out = sd.decode_chunks(c, sc)
            err = (out.float() - full.float()).abs().max().item()
            print(
                f"check {name} frames={a.check_frames}: max|chunked - whole| = {err:.3e} "
                f"(whole rms {full.float().pow(2).mean().sqrt().item():.3f})"
            )
    for b, r in bench_modes(dec, a.batch_sizes, a.chunk, a.context, iters=a.iters).items():
        print(
            f"B={b:3d} windowed {r['windowed_ms']:8.1f} ms {r['windowed_audio_s_per_s']:8.1f} audio-s/s | "
            f"stateful {r['stateful_ms']:8.1f} ms {r['stateful_audio_s_per_s']:8.1f} audio-s/s | "
            f"x{r['speedup']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
