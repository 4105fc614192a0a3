"""A Triton kernel for one residual unit of the codec's vocoder, channels-last (a probe: not yet
on the serving path).

A vocoder residual unit (``model/codec.py`` ``ResidualUnit``) is ``x + conv_k1(snake2(conv_k7_d(
snake1(x))))``, the k7 convolution dilated by ``d`` and causal, its past inputs carried as state
(``model/stateful_codec.py``). Compiled by inductor around cuDNN it is five passes over the
activations at least (run 39b: of the 32 x 25 call's 18.9 ms, 8.7 are convolutions and 7.3
elementwise kernels, the largest at the 96- and 192-channel blocks' sample rates).
:func:`residual_unit` does it in one
kernel: each program takes ``BT`` samples of one stream with every channel, and

* builds the k7 convolution as seven shifted ``[BT, C] x [C, C]`` products (an implicit GEMM),
  the inputs read from the new samples with SnakeBeta applied on the load, or from the state
  (already SnakeBeta'd) for the samples before the call;
* adds the bias, applies the second SnakeBeta in registers, multiplies by the k1 weight in
  ``BN``-wide slices of the output channels, adds its bias and the input, and stores.

The activations are read once (the taps' shifted re-reads come from L1/L2) and written once.
Channels are zero-padded to a power of two (96 -> 128, 192 -> 256) in the packed weights, so the
padded channels stay 0 through both SnakeBetas. ``scripts/codec_kernel_probe.py`` times it against
the compiled torch unit on the GPU; ``tests/kernels_interp.py`` checks it in the interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from triton_qwen3_tts.engines.native.kernels import _INTERPRET, triton

if triton is not None:
    import triton.language as tl

    from triton_qwen3_tts.engines.native.kernels import _dot


def _pow2(n: int) -> int:
    return 1 << max(4, (int(n) - 1).bit_length())


@dataclass
class PackedUnit:
    """A residual unit's parameters as the kernel reads them: ``w1`` ``[7, CP, CP]`` (tap, in,
    out), ``w2`` ``[CP, CP]`` (in, out) in the activations' dtype; biases and SnakeBeta's
    ``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)`` fp32 ``[CP]``; zero past ``C``."""

    C: int
    CP: int
    dilation: int
    w1: torch.Tensor
    b1: torch.Tensor
    a1: torch.Tensor
    ib1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    a2: torch.Tensor
    ib2: torch.Tensor

    @property
    def past(self) -> int:
        return 6 * self.dilation


def pack_unit(ru, dtype=None) -> PackedUnit:
    """:class:`PackedUnit` of a ``ResidualUnit`` (its conv1 k7, conv2 k1 and two SnakeBetas)."""
    w1, w2 = ru.conv1.conv.weight, ru.conv2.conv.weight  # [C, C, 7], [C, C, 1]
    C, dev = w1.shape[0], w1.device
    dtype = dtype or w1.dtype
    CP = _pow2(C)

    def vec(v):
        out = torch.zeros(CP, device=dev, dtype=torch.float32)
        out[:C] = v.float()
        return out

    p1 = torch.zeros(7, CP, CP, device=dev, dtype=dtype)
    p1[:, :C, :C] = w1.detach().permute(2, 1, 0).to(dtype)
    p2 = torch.zeros(CP, CP, device=dev, dtype=dtype)
    p2[:C, :C] = w2.detach()[:, :, 0].t().to(dtype)
    with torch.no_grad():
        return PackedUnit(
            C=C,
            CP=CP,
            dilation=int(ru.conv1.conv.dilation[0]),
            w1=p1,
            b1=vec(ru.conv1.conv.bias.detach()),
            a1=vec(torch.exp(ru.act1.alpha.detach().float())),
            ib1=vec(1.0 / (torch.exp(ru.act1.beta.detach().float()) + 1e-9)),
            w2=p2,
            b2=vec(ru.conv2.conv.bias.detach()),
            a2=vec(torch.exp(ru.act2.alpha.detach().float())),
            ib2=vec(1.0 / (torch.exp(ru.act2.beta.detach().float()) + 1e-9)),
        )


if triton is not None:

    @triton.jit
    def _snake(x, a, ib):
        s = tl.sin(x * a[None, :])
        return x + ib[None, :] * s * s

    @triton.jit
    def _resunit_kernel(
        x_ptr,  # [B, L, C] (the channels-last activations' memory)
        past_ptr,  # [B, C, P]: SnakeBeta'd inputs of the P = 6 * DIL samples before this call
        y_ptr,  # [B, L, C]
        w1_ptr,
        b1_ptr,
        a1_ptr,
        ib1_ptr,
        w2_ptr,
        b2_ptr,
        a2_ptr,
        ib2_ptr,
        L,
        C,
        P,
        DIL: tl.constexpr,
        CP: tl.constexpr,
        BT: tl.constexpr,
        BK: tl.constexpr,
        BN: tl.constexpr,
        UPCAST: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        b = tl.program_id(1).to(tl.int64)
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        co = tl.arange(0, CP)
        x_row = x_ptr + b * L * C
        p_row = past_ptr + b * C * P
        acc = tl.zeros((BT, CP), dtype=tl.float32)
        for k in tl.static_range(7):
            src = t - (6 - k) * DIL  # the input sample of tap k
            cur = (src >= 0) & (src < L)
            old = (src < 0) & (src >= -P)
            for c0 in tl.static_range(0, CP, BK):
                ci = c0 + tl.arange(0, BK)
                cm = ci < C
                xv = tl.load(x_row + src[:, None] * C + ci[None, :], mask=cur[:, None] & cm[None, :], other=0.0)
                xs = _snake(
                    xv.to(tl.float32),
                    tl.load(a1_ptr + ci),
                    tl.load(ib1_ptr + ci),
                )
                pv = tl.load(p_row + ci[None, :] * P + (P + src)[:, None], mask=old[:, None] & cm[None, :], other=0.0)
                xs = tl.where(old[:, None], pv.to(tl.float32), xs)
                w = tl.load(w1_ptr + (k * CP + ci)[:, None] * CP + co[None, :])
                acc += _dot(xs.to(w.dtype), w, UPCAST, IEEE)
        h = _snake(acc + tl.load(b1_ptr + co)[None, :], tl.load(a2_ptr + co), tl.load(ib2_ptr + co))
        tm = t < L
        for n0 in tl.static_range(0, CP, BN):
            cn = n0 + tl.arange(0, BN)
            nm = cn < C
            w2 = tl.load(w2_ptr + co[:, None] * CP + cn[None, :])
            r = _dot(h.to(w2.dtype), w2, UPCAST, IEEE) + tl.load(b2_ptr + cn)[None, :]
            off = t[:, None] * C + cn[None, :]
            m = tm[:, None] & nm[None, :]
            xr = tl.load(x_row + off, mask=m, other=0.0)
            tl.store(y_ptr + b * L * C + off, (xr.to(tl.float32) + r).to(xr.dtype), mask=m)


def unit_state(x: torch.Tensor, past: torch.Tensor, pu: PackedUnit) -> torch.Tensor:
    """The unit's new state ``[B, C, P]``: the last ``P`` SnakeBeta'd inputs of ``past`` then ``x``
    (``x`` ``[B, L, C]``), in the activations' dtype."""
    P, C = pu.past, pu.C
    tail = x[:, max(0, x.shape[1] - P) :, :].float()
    s = tail + pu.ib1[:C] * torch.sin(tail * pu.a1[:C]) ** 2
    return torch.cat([past, s.to(x.dtype).transpose(1, 2)], dim=2)[:, :, -P:]


def residual_unit(
    x: torch.Tensor,
    past: torch.Tensor,
    pu: PackedUnit,
    *,
    bt: int = 64,
    bk: int = 32,
    bn: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
):
    """One residual unit on ``x`` ``[B, L, C]`` (contiguous: a ``[B, C, 1, L]`` channels-last
    tensor's memory) with its state ``past`` ``[B, C, 6 * dilation]`` -> (``y`` ``[B, L, C]``, the
    new state). The arithmetic of ``StatefulCodecDecoder``'s unit, the SnakeBetas in fp32 and the
    convolutions' sums in fp32 (no rounding of the k7 convolution's output to the activations'
    dtype before the second SnakeBeta)."""
    if triton is None:
        raise RuntimeError("the codec's residual-unit kernel needs the 'triton' package")
    B, L, C = x.shape
    if C != pu.C or tuple(past.shape) != (B, C, pu.past):
        raise ValueError(
            f"x {tuple(x.shape)} / past {tuple(past.shape)} do not fit a unit of {pu.C} channels, P {pu.past}"
        )
    x, past = x.contiguous(), past.contiguous()
    y = torch.empty_like(x)
    bn = min(bn, pu.CP)
    _resunit_kernel[(triton.cdiv(L, bt), B)](
        x,
        past,
        y,
        pu.w1,
        pu.b1,
        pu.a1,
        pu.ib1,
        pu.w2,
        pu.b2,
        pu.a2,
        pu.ib2,
        L,
        C,
        pu.past,
        DIL=pu.dilation,
        CP=pu.CP,
        BT=bt,
        BK=bk,
        BN=bn,
        UPCAST=_INTERPRET,
        IEEE=x.dtype == torch.float32,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return y, unit_state(x, past, pu)
