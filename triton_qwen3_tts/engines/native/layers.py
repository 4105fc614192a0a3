"""Fixed-shape step parts of the native engine over slot tables: fused norms, attention,
MLP, RoPE tables, top-k/top-p sampling over candidates, and ``torch.compile`` wrapping."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F


_NEG_INF = float("-inf")
CP_POSITIONS = 16  # code-predictor positions per frame: [h, C(c0)] + 14 residual rows (c15 never fed)


def _sample_ids(scores, greedy, temp, top_k, top_p, g, K: int, use_top_p: bool):
    """Argmax where ``greedy``; else temperature, top-k (<= K, ties kept), optionally top-p,
    Gumbel-max with noise ``g [B, K]``. ``scores [B, V]`` fp32; returns ids ``[B]`` int64.

    ``use_top_p=False`` (every sampled row has ``top_p == 1``) skips the softmax/cumsum; with it,
    rows whose ``top_p >= 1`` are left untouched, so a row samples the same whichever variant
    its batch runs."""
    arg = scores.argmax(dim=-1)
    vals, idx = torch.topk(scores / temp[:, None], K, dim=-1)  # sorted, descending
    kth = vals.gather(1, (top_k - 1).clamp(0, K - 1)[:, None])
    keep = vals >= kth
    if use_top_p:
        probs = torch.softmax(vals.masked_fill(~keep, _NEG_INF), dim=-1)
        excl = probs.cumsum(dim=-1) - probs
        tp = top_p[:, None]
        keep = keep & ((excl < tp) | (tp >= 1.0))
        keep[:, 0] = True
    choice = (vals + g).masked_fill(~keep, _NEG_INF).argmax(dim=-1)
    return torch.where(greedy, arg, idx.gather(1, choice[:, None])[:, 0])


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, one_kernel: bool) -> torch.Tensor:
    """Qwen3 RMSNorm over the last dim. ``one_kernel``: ``F.rms_norm`` with the weight (one fused
    kernel; in bf16 the weight multiply is done before the cast, so the rounding can differ from
    the reference). Otherwise normalise, cast, then scale, as the reference ``RMSNorm`` does
    (bit-identical to it in fp32)."""
    n = x.shape[-1]
    if one_kernel:
        return F.rms_norm(x, (n,), w, eps)
    return F.rms_norm(x, (n,), None, eps) * w


def _pre_attn(
    x,
    ln_w,
    wqkv,
    qk_w,
    cos,
    sin,
    eps: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    one_kernel_norm: bool,
    fused: bool,
):
    """Input norm, QKV projection, QK-norm and RoPE of one decoder layer.

    x ``[b, t, D]``; ``wqkv`` the concatenated q/k/v weights; ``qk_w [heads + kv_heads, hd]`` the
    q_norm weight repeated per q head, then the k_norm weight per kv head; cos/sin
    ``[b or 1, t, 1, hd]`` with the sign of rotate-half folded into sin (``sin[..., :hd/2]``
    negated), so RoPE is ``x * cos + roll(x, hd/2) * sin``. Returns q ``[b, H, t, hd]``, k, v
    ``[b, KV, t, hd]`` (transposed views)."""
    h = _rms(x, ln_w, eps, one_kernel_norm)
    nq, nk = heads * head_dim, kv_heads * head_dim
    if fused:
        qkv = F.linear(h, wqkv)
    else:  # A/B: three GEMMs on views of the same weights
        wq, wk, wv = wqkv.split((nq, nk, nk))
        qkv = torch.cat((F.linear(h, wq), F.linear(h, wk), F.linear(h, wv)), dim=-1)
    return _qk_rope(qkv, qk_w, cos, sin, eps, heads, kv_heads, head_dim)


def _qk_rope(qkv, qk_w, cos, sin, eps: float, heads: int, kv_heads: int, head_dim: int):
    """q/k RMSNorm and RoPE of a fused projection ``qkv [b, t, (H + 2 KV) * hd]`` (arguments
    as :func:`_pre_attn`'s). Returns q ``[b, H, t, hd]``, k, v ``[b, KV, t, hd]`` (transposed
    views)."""
    b, t, _ = qkv.shape
    nq, nk = heads * head_dim, kv_heads * head_dim
    qk = qkv[..., : nq + nk].reshape(b, t, heads + kv_heads, head_dim)
    qk = F.rms_norm(qk, (head_dim,), None, eps) * qk_w  # q_norm and k_norm in one pass
    qk = qk * cos + torch.roll(qk, head_dim // 2, dims=-1) * sin
    v = qkv[..., nq + nk :].reshape(b, t, kv_heads, head_dim)
    return qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), v.transpose(1, 2)


def _post_attn(x, o, wo, ln_w, wgu, wdown, eps: float, inter: int, one_kernel_norm: bool, fused: bool):
    """o-proj + residual, post-attention norm, SwiGLU MLP (gate/up as one GEMM) + residual.
    ``o [b, H, t, hd]`` the attention output."""
    b, _, t, _ = o.shape
    x = x + F.linear(o.transpose(1, 2).reshape(b, t, -1), wo)
    h = _rms(x, ln_w, eps, one_kernel_norm)
    if fused:
        g, u = F.linear(h, wgu).split(inter, dim=-1)
    else:
        g, u = F.linear(h, wgu[:inter]), F.linear(h, wgu[inter:])
    return x + F.linear(F.silu(g) * u, wdown)


def _attn_math(q, k, v, allowed, heads, kv_heads, head_dim):
    """The reference attention arithmetic (talker.Attention): GQA by repeat, fp32 softmax.
    ``allowed``: bool broadcastable to ``[B, H, Tq, Tk]``, or None (all keys)."""
    rep = heads // kv_heads
    kk = k.repeat_interleave(rep, dim=1)
    vv = v.repeat_interleave(rep, dim=1)
    scores = (q @ kk.transpose(-1, -2)) * (head_dim**-0.5)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, _NEG_INF)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ vv


class _Layer:
    """One decoder layer's weights for the engine: q/k/v and gate/up concatenated once at load.

    The reference modules' ``q_proj``/``k_proj``/``v_proj``/``gate_proj``/``up_proj`` weights are
    re-pointed to views of the fused tensors (same values, same checkpoint names, no second copy
    of the weights), so the reference model keeps working on the same storage."""

    def __init__(self, layer):
        a, mlp = layer.self_attn, layer.mlp
        self.heads, self.kv_heads, self.head_dim = a.heads, a.kv_heads, a.head_dim
        self.eps = float(layer.input_layernorm.eps)
        self.inter = mlp.gate_proj.weight.shape[0]
        with torch.no_grad():
            self.wqkv = _fuse(a.q_proj, a.k_proj, a.v_proj)
            self.wgu = _fuse(mlp.gate_proj, mlp.up_proj)
            self.qk_w = torch.cat(
                (a.q_norm.weight.expand(a.heads, -1), a.k_norm.weight.expand(a.kv_heads, -1))
            ).contiguous()
        self.wo, self.wdown = a.o_proj.weight, mlp.down_proj.weight
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight


def _fuse(*linears) -> torch.Tensor:
    w = torch.cat([m.weight.detach() for m in linears], dim=0)
    o = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(w[o : o + n], requires_grad=False)
        o += n
    return w


def _compiled(fn, backend: str):
    """``torch.compile(fn, dynamic=False, fullgraph=True)``. Every batch bucket and block shape
    is its own specialisation, so the recompile limits are raised; dynamo's config is
    thread-local and the engine runs on executor threads, so the limits are set in the calling
    thread on every call (a few attribute reads; with CUDA graphs only warm-up and capture call)."""
    import torch._dynamo

    dc = torch._dynamo.config
    name = "recompile_limit" if hasattr(dc, "recompile_limit") else "cache_size_limit"
    acc = (
        "accumulated_recompile_limit" if hasattr(dc, "accumulated_recompile_limit") else "accumulated_cache_size_limit"
    )
    compiled = torch.compile(fn, dynamic=False, fullgraph=True, backend=backend)

    def call(*args):
        if getattr(dc, name) < 1024:
            setattr(dc, name, 1024)
        if hasattr(dc, acc) and getattr(dc, acc) < 8192:
            setattr(dc, acc, 8192)
        return compiled(*args)

    return call


def _rope_tables(rotary, n: int, device, dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos, sign-folded sin ``[n, hd]`` for positions ``0..n-1`` (the reference rotary's values)."""
    cos, sin = rotary(torch.arange(n, device=device)[None], dtype)
    cos, sin = cos[0], sin[0].clone()
    sin[:, : sin.shape[-1] // 2].neg_()
    return cos.contiguous(), sin.contiguous()
