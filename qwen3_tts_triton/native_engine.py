"""NativeEngine: the Qwen3-TTS talker + code predictor in plain PyTorch, continuous batching at
frame granularity, one CUDA graph per (batch bucket, context bucket, top-p variant), batched
prefill captured per (batch bucket, length bucket) (design: docs/design/native-engine.md).

Same request type and async interface as the vLLM :class:`~qwen3_tts_triton.engine.TalkerEngine`::

    engine = await NativeEngine.create(checkpoint_dir, NativeEngineConfig(device="cuda"))
    async for frames in engine.synthesize(TalkerRequest(...)):   # np.int32 [n, 16]
        ...
    await engine.abort(request_id); engine.stats(); engine.shutdown()

Layout (all on the device, allocated once):

* talker KV cache ``k_cache``/``v_cache`` ``[layers, slots + 1, kv_heads, max_model_len, head_dim]``
  (the last slot is scratch: padding rows of a captured prefill bucket write there);
* code-predictor KV ``[cp_layers, slots, kv_heads, 16, head_dim]`` (rewritten every frame);
* per-slot state tables ``[slots + 1, ...]``: last hidden ``h``, last ``c0``, frame index, next
  talker position, c0 count, c0 presence mask ``[slots, vocab]`` (repetition penalty), trailing
  text rows ``[slots, max_trailing, D]`` + their count, sampling parameters, RNG key;
* per layer, q/k/v and gate/up concatenated into one weight each (the reference modules keep
  views of them), RoPE cos/sin tables, the stacked residual-codebook tables.

Active requests always occupy slots ``0..n-1`` (a leaving request's slot is filled by moving the
last active slot into it), so a decode step of bucket ``B >= n`` works on the plain prefix views
``[:B]`` of every table: no gather, and padded rows ``n..B-1`` run on free slots, whose results
are never read (the free slots act as the scratch rows). A step advances a row's counters
(position, frame index, c0 count) by its ``live`` flag (1 for an admitted slot, 0 for a free
one), so a free slot that is padding for many steps stays at position 0 instead of walking past
``max_model_len`` (which indexed the RoPE table and the KV cache out of bounds). A step mutates the tables in place,
so a captured graph needs no input copies: admission writes a slot's rows, replay reads them.
All requests admitted in one scheduler round are prefilled together, right-padded to one length.

Sampling is done on the device without torch RNG state: Gumbel-max over the top-``max_top_k``
candidates with noise from a counter-based integer hash of (request key, draw index, candidate
rank). Same seed -> same frames, independent of batch composition, bucket, top-p variant or graph
replay. Greedy requests take the argmax after the same codebook-0 processing as the reference
(repetition penalty, min_new_tokens, suppression) and reproduce ``generate_codes``.

Imports neither vLLM nor Triton.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .engine import EngineError, TalkerRequest, check_prompt_frames_trailing
from .sampling import gumbel_from_bits

__all__ = ["NativeEngineConfig", "NativeEngine", "NativeModel", "EngineError", "TalkerRequest",
           "gumbel_noise", "hash_seed"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_NEG_INF = float("-inf")
_M32 = 0xFFFFFFFF
CP_POSITIONS = 16  # code-predictor positions per frame: [h, C(c0)] + 14 residual rows (c15 never fed)


def _pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


@dataclass(frozen=True)
class NativeEngineConfig:
    """Settings of the native engine; validated on construction (:class:`EngineError`).

    * ``max_num_seqs``: slots (concurrent requests decoding at once); more wait in a queue.
    * ``max_model_len``: talker positions per request (prompt + frames + 1).
    * ``device``: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``; ``dtype``: float32 | bfloat16 | float16.
    * ``cuda_graphs``: capture one graph per (batch bucket, context bucket) at start (CUDA only;
      ignored on CPU, which always runs eagerly).
    * ``batch_buckets``: decode batch sizes; capped by ``max_num_seqs``, which is always added.
    * ``ctx_buckets``: attention context lengths the talker step is specialised for (None: powers
      of two from 256, capped by and always including ``max_model_len``).
    * ``max_trailing_tokens``: trailing text rows a request may carry.
    * ``max_top_k``: candidates kept for sampling; a request's ``top_k``/``sub_top_k`` must not
      exceed it (set it to the vocabulary size to allow any top-k, at some cost).
    * ``seed``: seeds the keys of requests that carry no seed (reproducible engine runs).
    * ``fast_math``: None -> True on CUDA: fused SDPA attention, one-kernel RMSNorm
      (``F.rms_norm`` with the weight) and a stacked gather for the residual-codebook embeddings;
      False keeps the reference's op order and rounding (CPU default).
    * ``fuse_weights``: q/k/v as one GEMM and gate/up as one GEMM (the fused tensors are built
      once at load; False runs three and two GEMMs on views of them, for A/B timing).
    * ``skip_top_p``: decode steps whose sampled rows all have ``top_p == 1`` leave the top-p
      filter out (a second graph variant per bucket, chosen on the host); False always runs it.
    * ``compile``: wrap the decode step's per-layer blocks (pre-attention: norm, QKV, QK-norm,
      RoPE; post-attention: o-proj, norm, MLP) and the noise/sampling functions in
      ``torch.compile(dynamic=False, fullgraph=True)`` (``compile_backend``, default inductor);
      they are compiled during the graph warm-up, before capture. KV writes and SDPA stay eager;
      prefill stays uncompiled. Meant for CUDA (inductor on CPU needs a C++ compiler).
    * ``batched_prefill``: the requests admitted in one scheduler round are prefilled together,
      right-padded to one length, in groups of at most ``prefill_max_tokens`` padded rows
      (False: one prefill per request, for A/B timing).
    * ``prefill_graphs``: None -> as ``cuda_graphs``: capture the prefill per (batch bucket,
      length bucket) with ``P * L <= prefill_max_tokens`` (``prefill_len_sizes``); other
      shapes run eagerly.
    """

    max_num_seqs: int = 8
    max_model_len: int = 2048
    device: str = "cuda"
    dtype: str = "bfloat16"
    cuda_graphs: bool = True
    seed: int = 0
    batch_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    ctx_buckets: Optional[Tuple[int, ...]] = None
    max_trailing_tokens: int = 512
    max_top_k: int = 64
    fast_math: Optional[bool] = None
    fuse_weights: bool = True
    skip_top_p: bool = True
    compile: bool = False
    compile_backend: str = "inductor"
    batched_prefill: bool = True
    prefill_max_tokens: int = 4096
    prefill_graphs: Optional[bool] = None

    def __post_init__(self):
        def bad(f, msg):
            raise EngineError(f"NativeEngineConfig.{f}: {msg}")

        for f in ("max_num_seqs", "max_model_len", "max_trailing_tokens", "max_top_k", "prefill_max_tokens"):
            if not _pos_int(getattr(self, f)):
                bad(f, f"must be a positive int, got {getattr(self, f)!r}")
        if self.max_model_len < 3:
            bad("max_model_len", "must be >= 3 (prompt + at least one frame)")
        if not isinstance(self.device, str) or not (
                self.device == "cpu" or self.device == "cuda" or
                (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            bad("device", f"{self.device!r}; allowed: 'cpu', 'cuda', 'cuda:N'")
        if self.dtype not in _DTYPES:
            bad("dtype", f"{self.dtype!r}; allowed: {', '.join(_DTYPES)}")
        if not isinstance(self.cuda_graphs, bool):
            bad("cuda_graphs", f"must be a bool, got {self.cuda_graphs!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            bad("seed", f"must be a non-negative int, got {self.seed!r}")
        for f in ("batch_buckets", "ctx_buckets"):
            v = getattr(self, f)
            if v is None and f == "ctx_buckets":
                continue
            if not isinstance(v, (tuple, list)) or not v or not all(_pos_int(b) for b in v):
                bad(f, f"must be a non-empty sequence of positive ints, got {v!r}")
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            bad("compile_backend", f"must be a torch.compile backend name, got {self.compile_backend!r}")
        if self.prefill_graphs is not None and not isinstance(self.prefill_graphs, bool):
            bad("prefill_graphs", f"must be a bool or None, got {self.prefill_graphs!r}")
        for f in ("fuse_weights", "skip_top_p", "compile", "batched_prefill"):
            if not isinstance(getattr(self, f), bool):
                bad(f, f"must be a bool, got {getattr(self, f)!r}")
        if self.fast_math is not None and not isinstance(self.fast_math, bool):
            bad("fast_math", f"must be a bool or None, got {self.fast_math!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def use_graphs(self) -> bool:
        return self.cuda_graphs and self.device.startswith("cuda")

    @property
    def use_prefill_graphs(self) -> bool:
        return self.use_graphs and (self.prefill_graphs is None or self.prefill_graphs)

    def prefill_len_sizes(self) -> Tuple[int, ...]:
        """Prompt-length buckets of the captured prefills: powers of two from 16 up to
        ``min(max_model_len, prefill_max_tokens)``; longer prompts prefill eagerly."""
        out, L = [], 16
        while L <= min(self.max_model_len, self.prefill_max_tokens):
            out.append(L)
            L *= 2
        return tuple(out)

    @property
    def use_fast_math(self) -> bool:
        return self.device.startswith("cuda") if self.fast_math is None else self.fast_math

    def batch_sizes(self) -> Tuple[int, ...]:
        """Effective decode buckets: configured ones <= max_num_seqs, plus max_num_seqs."""
        return tuple(sorted({b for b in self.batch_buckets if b <= self.max_num_seqs} | {self.max_num_seqs}))

    def ctx_sizes(self) -> Tuple[int, ...]:
        """Effective attention context buckets (ascending; the last is max_model_len)."""
        if self.ctx_buckets is None:
            out, c = set(), 256
            while c < self.max_model_len:
                out.add(c)
                c *= 2
        else:
            out = {c for c in self.ctx_buckets if c < self.max_model_len}
        return tuple(sorted(out | {self.max_model_len}))


# ------------------------------------------------------------------------------------------------
# Counter-based RNG (graph-safe, no torch generator state)
# ------------------------------------------------------------------------------------------------

def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors (values kept in [0, 2^32); products < 2^63)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & _M32
    x = x ^ (x >> 12)
    return x


def hash_seed(seed: int) -> int:
    """A request's 32-bit RNG key from a (up to 63-bit) seed."""
    s = int(seed) & ((1 << 63) - 1)
    t = torch.tensor([s & _M32, (s >> 32) & _M32], dtype=torch.int64)
    return int(_mix32(t[0] ^ _mix32(t[1] + 0x51ED27)))


def _gumbel(key: torch.Tensor, counter: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise ``[B, J, K]`` for keys ``key [B]``, draw counters ``counter [B, J]`` and
    candidate ranks ``cols [K]``: every element depends only on its (key, counter, rank), so one
    call for all 15 residual draws of a frame equals 15 separate calls bit for bit."""
    s = _mix32(key[:, None] ^ _mix32(counter + 0x3C6EF372))  # [B, J]
    x = _mix32(s[..., None] ^ ((cols * 0x9E3779B1) & _M32))
    x = _mix32(x + 0x6A09E667)
    return gumbel_from_bits(x >> 8)  # finite for every input (sampling.gumbel_from_bits)


def gumbel_noise(key: torch.Tensor, counter: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise ``[B, K]`` fp32 for request keys ``key [B]``, draw counters
    ``counter [B]`` and candidate ranks ``cols [K]`` (all int64 on the same device)."""
    return _gumbel(key, counter[:, None], cols)[:, 0]


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


# ------------------------------------------------------------------------------------------------
# Model: fixed-shape step parts over slot tables
# ------------------------------------------------------------------------------------------------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, one_kernel: bool) -> torch.Tensor:
    """Qwen3 RMSNorm over the last dim. ``one_kernel``: ``F.rms_norm`` with the weight (one fused
    kernel; in bf16 the weight multiply is done before the cast, so the rounding can differ from
    the reference). Otherwise normalise, cast, then scale, as the reference ``RMSNorm`` does
    (bit-identical to it in fp32)."""
    n = x.shape[-1]
    if one_kernel:
        return F.rms_norm(x, (n,), w, eps)
    return F.rms_norm(x, (n,), None, eps) * w


def _pre_attn(x, ln_w, wqkv, qk_w, cos, sin, eps: float, heads: int, kv_heads: int, head_dim: int,
              one_kernel_norm: bool, fused: bool):
    """Input norm, QKV projection, QK-norm and RoPE of one decoder layer.

    x ``[b, t, D]``; ``wqkv`` the concatenated q/k/v weights; ``qk_w [heads + kv_heads, hd]`` the
    q_norm weight repeated per q head, then the k_norm weight per kv head; cos/sin
    ``[b or 1, t, 1, hd]`` with the sign of rotate-half folded into sin (``sin[..., :hd/2]``
    negated), so RoPE is ``x * cos + roll(x, hd/2) * sin``. Returns q ``[b, H, t, hd]``, k, v
    ``[b, KV, t, hd]`` (transposed views)."""
    b, t, _ = x.shape
    h = _rms(x, ln_w, eps, one_kernel_norm)
    nq, nk = heads * head_dim, kv_heads * head_dim
    if fused:
        qkv = F.linear(h, wqkv)
    else:  # A/B: three GEMMs on views of the same weights
        wq, wk, wv = wqkv.split((nq, nk, nk))
        qkv = torch.cat((F.linear(h, wq), F.linear(h, wk), F.linear(h, wv)), dim=-1)
    qk = qkv[..., :nq + nk].reshape(b, t, heads + kv_heads, head_dim)
    qk = F.rms_norm(qk, (head_dim,), None, eps) * qk_w  # q_norm and k_norm in one pass
    qk = qk * cos + torch.roll(qk, head_dim // 2, dims=-1) * sin
    v = qkv[..., nq + nk:].reshape(b, t, kv_heads, head_dim)
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
    scores = (q @ kk.transpose(-1, -2)) * (head_dim ** -0.5)
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
            self.qk_w = torch.cat((a.q_norm.weight.expand(a.heads, -1),
                                   a.k_norm.weight.expand(a.kv_heads, -1))).contiguous()
        self.wo, self.wdown = a.o_proj.weight, mlp.down_proj.weight
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight


def _fuse(*linears) -> torch.Tensor:
    w = torch.cat([m.weight.detach() for m in linears], dim=0)
    o = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(w[o:o + n], requires_grad=False)
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
    acc = ("accumulated_recompile_limit" if hasattr(dc, "accumulated_recompile_limit")
           else "accumulated_cache_size_limit")
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
    sin[:, :sin.shape[-1] // 2].neg_()
    return cos.contiguous(), sin.contiguous()


class NativeModel:
    """Weights (taken from the reference :class:`~qwen3_tts_triton.talker.Talker`), static
    buffers and the three parts of a decode step. Not thread-safe: one caller at a time."""

    def __init__(self, talker, cfg: NativeEngineConfig, tts_pad_token_id: int):
        self.cfg = cfg
        self.talker = talker
        tc = talker.config
        cpc = tc.code_predictor
        self.tc, self.cpc = tc, cpc
        dev = talker.codec_head.weight.device
        self.device, self.dtype = dev, talker.codec_head.weight.dtype
        self.fast = cfg.use_fast_math
        S, M = cfg.max_num_seqs, cfg.max_model_len
        self.S, self.M = S, M
        self.D = tc.hidden_size
        self.V = tc.vocab_size
        self.cb = tc.codebook_size
        self.eos = tc.codec_eos_token_id
        self.G = tc.num_code_groups
        self.R = self.G - 1
        self.cpV = cpc.vocab_size
        if cfg.max_top_k > min(self.V, self.cpV):
            # allowed: clipped to the smaller vocabulary for residuals separately
            pass
        self.K0 = min(cfg.max_top_k, self.V)
        self.KR = min(cfg.max_top_k, self.cpV)
        for mod in talker.modules():  # meta-built rotary buffers (assign-loading) -> real ones
            if hasattr(mod, "inv_freq") and hasattr(mod, "_inv_freq") and (
                    mod.inv_freq.is_meta or mod.inv_freq.device != dev):
                mod.inv_freq = mod._inv_freq(dev)
        dt = self.dtype
        L, kvh, hd = tc.num_hidden_layers, tc.num_key_value_heads, tc.head_dim
        # slot S is a scratch slot: padded rows of a captured prefill bucket write there
        S1 = S + 1
        self.SCR = S
        self.k_cache = torch.zeros(L, S1, kvh, M, hd, device=dev, dtype=dt)
        self.v_cache = torch.zeros_like(self.k_cache)
        cL, ckvh, chd = cpc.num_hidden_layers, cpc.num_key_value_heads, cpc.head_dim
        self.cp_k = torch.zeros(cL, S, ckvh, CP_POSITIONS, chd, device=dev, dtype=dt)
        self.cp_v = torch.zeros_like(self.cp_k)
        T = cfg.max_trailing_tokens
        z = lambda *s, d=torch.int64: torch.zeros(*s, device=dev, dtype=d)  # noqa: E731
        # per-slot state
        self.h = z(S1, self.D, d=dt)
        self.c0 = z(S1)
        self.frame_idx = z(S1)       # frames emitted so far == index of the frame being built
        self.pos = z(S1)             # talker position the next input is written at
        self.ngen = z(S1)            # c0 tokens sampled so far
        self.presence = z(S1, self.V, d=torch.bool)
        self.trailing = z(S1, T, self.D, d=dt)
        self.n_trailing = z(S1)
        self.key = z(S1)
        self.greedy = z(S1, d=torch.bool)
        self.sub_greedy = z(S1, d=torch.bool)
        self.suppress_eos = z(S1, d=torch.bool)
        self.min_new = z(S1)
        self.temp = torch.ones(S1, device=dev, dtype=torch.float32)
        self.top_k = torch.ones(S1, device=dev, dtype=torch.int64)
        self.top_p = torch.ones(S1, device=dev, dtype=torch.float32)
        self.rep = torch.ones(S1, device=dev, dtype=torch.float32)
        self.sub_temp = torch.ones(S1, device=dev, dtype=torch.float32)
        self.sub_top_k = torch.ones(S1, device=dev, dtype=torch.int64)
        self.live = z(S1)            # 1 while the slot holds a request: the step's counter increment
        self.state = [self.h, self.c0, self.frame_idx, self.pos, self.ngen, self.presence,
                      self.trailing, self.n_trailing, self.key, self.greedy, self.sub_greedy,
                      self.suppress_eos, self.min_new, self.temp, self.top_k, self.top_p, self.rep,
                      self.sub_temp, self.sub_top_k, self.live]
        # step intermediates / outputs (static: graph parts communicate through them)
        self.frames = z(S, self.G)
        self.x_in = z(S, self.D, d=dt)
        self.h_new = z(S, self.D, d=dt)
        self.logits = torch.zeros(S, self.V, device=dev, dtype=torch.float32)
        self.out = z(S, self.G + 1)  # frame codes + done flag (next c0 == EOS)
        # constants
        self.ar = torch.arange(S, device=dev)
        # batched prefill inputs (static, for the captured prefill buckets): padded prompts
        # [P, Lb, D] in a flat buffer, each row's slot (padding rows: the scratch slot) and last
        # prompt index; the sampled c0 of each row comes back in pf_c0
        self.pf_cap = max(cfg.prefill_max_tokens, M)
        self.pf_x = torch.zeros(self.pf_cap * self.D, device=dev, dtype=dt)
        self.pf_slots = torch.full((S,), S, device=dev, dtype=torch.int64)
        self.pf_last = z(S)
        self.pf_c0 = z(S)
        self.zeros_i = z(S)
        self.true_ = torch.ones((), device=dev, dtype=torch.bool)
        self.key_idx = torch.arange(M, device=dev)
        self.cols0 = torch.arange(self.K0, device=dev)
        self.colsR = torch.arange(self.KR, device=dev)
        self.res_draws = torch.arange(1, self.R + 1, device=dev)
        self.tril2 = torch.ones(2, 2, dtype=torch.bool, device=dev).tril()
        # the decode step's blocks (compiled with ``compile``); prefill calls the plain functions
        self._pre, self._post, self._noise, self._samp = _pre_attn, _post_attn, _gumbel, _sample_ids
        if cfg.compile:
            self._pre, self._post, self._noise, self._samp = (
                _compiled(f, cfg.compile_backend) for f in (_pre_attn, _post_attn, _gumbel, _sample_ids))
        special = torch.zeros(self.V, dtype=torch.bool, device=dev)
        special[self.cb:] = True
        special[self.eos] = False
        self.special = special
        eos_hot = torch.zeros(self.V, dtype=torch.bool, device=dev)
        eos_hot[self.eos] = True
        self.eos_hot = eos_hot
        with torch.inference_mode():
            self.tts_pad = talker.embed_text(torch.tensor([tts_pad_token_id], device=dev))[0].clone()
            # RoPE tables (cos, sign-folded sin), gathered by position instead of recomputed
            self.cos, self.sin = _rope_tables(talker.model.rotary_emb, M, dev, dt)  # [M, hd]
            self.cp_cos, self.cp_sin = _rope_tables(talker.code_predictor.model.rotary_emb,
                                                    CP_POSITIONS, dev, dt)  # [16, hd]
        self.layers = [_Layer(l) for l in talker.model.layers]
        self.cp_layers = [_Layer(l) for l in talker.code_predictor.model.layers]
        self.norm_w = talker.model.norm.weight
        self.norm_eps = float(talker.model.norm.eps)
        self.cp_norm_w = talker.code_predictor.model.norm.weight
        self.cp_norm_eps = float(talker.code_predictor.model.norm.eps)
        self.fused = cfg.fuse_weights
        if self.fast:  # the 15 residual tables stacked; the modules keep views of it (no copy)
            tables = talker.code_predictor.model.codec_embedding
            with torch.no_grad():
                self.res_tables = torch.stack([e.weight.detach() for e in tables])
            for j, e in enumerate(tables):
                e.weight = torch.nn.Parameter(self.res_tables[j], requires_grad=False)
            self.res_offsets = torch.arange(self.R, device=dev) * self.cpV

    # -- slot management --------------------------------------------------------------------
    def reset_slot(self, s: int) -> None:
        for t in self.state:
            t[s].zero_()

    def reset_all(self) -> None:
        for t in self.state:
            t.zero_()

    def reset_rows(self, a: int, b: int) -> None:
        for t in self.state:
            t[a:b].zero_()

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src`` (KV positions ``[0, length)`` and every state row) onto ``dst``."""
        self.k_cache[:, dst, :, :length].copy_(self.k_cache[:, src, :, :length])
        self.v_cache[:, dst, :, :length].copy_(self.v_cache[:, src, :, :length])
        for t in self.state:
            t[dst].copy_(t[src])

    # -- layers ------------------------------------------------------------------------------
    def _qkv(self, ly: _Layer, x, cos, sin, fn=None):
        """cos/sin ``[b or 1, t, 1, hd]`` (rows of the RoPE tables); ``fn``: the block function
        (default: the decode step's, compiled with ``compile``)."""
        return (fn or self._pre)(x, ly.ln1, ly.wqkv, ly.qk_w, cos, sin, ly.eps, ly.heads, ly.kv_heads,
                                 ly.head_dim, self.fast, self.fused)

    def _finish_layer(self, ly: _Layer, x, attn_out, fn=None):
        return (fn or self._post)(x, attn_out, ly.wo, ly.ln2, ly.wgu, ly.wdown, ly.eps, ly.inter,
                                  self.fast, self.fused)

    def _attend(self, a, q, k, v, allowed=None, causal=False, add_mask=None):
        """Attention of q ``[b, H, t, hd]`` over k/v ``[b, KV, Tk, hd]``.

        Exact math (``fast_math`` off): the reference arithmetic with the bool mask ``allowed``
        (None: all keys). Fast: SDPA with no boolean mask: ``causal`` (Tq == Tk) as
        ``is_causal``; ``add_mask`` (an additive float mask ``[b, 1, 1, Tk]``, one-row decode)
        with the query heads of each kv group folded into the query length, so the call is
        plain multi-head attention (no GQA expansion) that the fused kernels take."""
        if not self.fast:
            return _attn_math(q, k, v, allowed, a.heads, a.kv_heads, a.head_dim)
        if add_mask is not None:
            b = q.shape[0]
            rep = a.heads // a.kv_heads
            o = F.scaled_dot_product_attention(q.reshape(b, a.kv_heads, rep, a.head_dim), k, v,
                                               attn_mask=add_mask)
            return o.reshape(b, a.heads, 1, a.head_dim)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    # -- prefill (a batch of new requests, padded to one length) ----------------------------
    @torch.inference_mode()
    def prefill_rows(self, P: int, Lb: int) -> None:
        """Prefill ``P`` prompts padded (on the right, with zeros) to ``Lb`` rows, read from the
        static inputs ``pf_x [P, Lb, D]``, ``pf_slots [P]`` and ``pf_last [P]`` (last real row).
        Writes each row's KV ``[0, Lb)`` into its slot, ``h`` (final-norm hidden of the last
        prompt row), and samples ``c0_0`` (no history; draw counter 0) into ``c0``, ``presence``,
        ``ngen`` and ``pf_c0``. The sampling parameters of the slots must be written first.

        Causal attention makes the right padding invisible to the real rows; the padded
        positions' KV is garbage past the prompt, which decode overwrites (position ``pos``) or
        masks (``key > pos``). Fixed shapes and index ops only: captured per (P, Lb) bucket.
        Prefill always uses the plain (uncompiled) blocks."""
        D = self.D
        x = self.pf_x[:P * Lb * D].view(P, Lb, D)
        slots, last = self.pf_slots[:P], self.pf_last[:P]
        cos, sin = self.cos[None, :Lb, None], self.sin[None, :Lb, None]
        allowed = None if self.fast else torch.ones(Lb, Lb, dtype=torch.bool, device=self.device).tril()
        for i, ly in enumerate(self.layers):
            q, k, v = self._qkv(ly, x, cos, sin, _pre_attn)
            self.k_cache[i, :, :, :Lb].index_copy_(0, slots, k)
            self.v_cache[i, :, :, :Lb].index_copy_(0, slots, v)
            o = self._attend(ly, q, k, v, allowed, causal=True)
            x = self._finish_layer(ly, x, o, _post_attn)
        hn = _rms(x[self.ar[:P], last], self.norm_w, self.norm_eps, self.fast)  # [P, D]
        self.h.index_copy_(0, slots, hn)
        logits = self.talker.codec_logits(hn).float()
        ngen = self.zeros_i[:P]
        scores = self.process_c0(logits, self.presence[slots], ngen, self.min_new[slots],
                                 self.suppress_eos[slots], self.rep[slots])
        c0 = self._sample(scores, self.greedy[slots], self.temp[slots], self.top_k[slots],
                          self.top_p[slots], self.key[slots], ngen, self.cols0, self.K0, True, plain=True)
        self.c0.index_copy_(0, slots, c0)
        self.presence.index_put_((slots, c0), self.true_)
        self.ngen.index_fill_(0, slots, 1)
        self.pf_c0[:P].copy_(c0)

    # -- sampling ----------------------------------------------------------------------------
    def _sample(self, scores, greedy, temp, top_k, top_p, key, counter, cols, K, use_top_p=True,
                plain=False):
        """Codebook-0 style sampling of ``scores [B, V]`` (already processed) with the noise of
        draw ``counter [B]``; returns ids ``[B]`` int64 (see :func:`_sample_ids`). ``plain``:
        the uncompiled functions (prefill, whose shapes vary)."""
        noise, samp = (_gumbel, _sample_ids) if plain else (self._noise, self._samp)
        g = noise(key, counter[:, None], cols)[:, 0]
        return samp(scores, greedy, temp, top_k, top_p, g, K, use_top_p)

    def process_c0(self, logits, presence, ngen, min_new, suppress_eos, rep):
        """Reference codebook-0 processing (sampling.process_c0_logits) on ``[B, V]``, batched."""
        lf = logits.float()
        pen = torch.where(lf > 0, lf / rep[:, None], lf * rep[:, None])
        lf = torch.where(presence, pen, lf)
        eos_off = (ngen < min_new) | suppress_eos
        return lf.masked_fill(self.special[None] | (self.eos_hot[None] & eos_off[:, None]), _NEG_INF)

    def sample_c0(self, B: int, logits: torch.Tensor, ngen: torch.Tensor, use_top_p: bool = True) -> torch.Tensor:
        sl = slice(0, B)
        scores = self.process_c0(logits, self.presence[sl], ngen, self.min_new[sl],
                                 self.suppress_eos[sl], self.rep[sl])
        return self._sample(scores, self.greedy[sl], self.temp[sl], self.top_k[sl], self.top_p[sl],
                            self.key[sl], ngen * CP_POSITIONS, self.cols0, self.K0, use_top_p)

    # -- step parts ----------------------------------------------------------------------------
    def part_code_predictor(self, B: int) -> None:
        """(h, c0) -> residual codes; writes ``frames[:B]``."""
        tk = self.talker
        cp = tk.code_predictor
        m = cp.model
        sl = slice(0, B)
        h, c0 = self.h[sl], self.c0[sl]
        sub_greedy, sub_temp, sub_k = self.sub_greedy[sl], self.sub_temp[sl], self.sub_top_k[sl]
        # the noise of all 15 residual draws (counters 16 * frame + j) in one pass
        counters = self.frame_idx[sl, None] * CP_POSITIONS + self.res_draws[None]
        noise = self._noise(self.key[sl], counters, self.colsR)  # [B, 15, KR]
        x = cp.small_to_mtp_projection(torch.stack([h, tk.model.codec_embedding(c0)], dim=1))
        codes = [c0]
        c = None
        for j in range(1, self.R + 1):
            if j == 1:
                p0, t = 0, 2
                allowed = self.tril2
            else:
                p0, t = j, 1
                allowed = None
                x = cp.small_to_mtp_projection(m.codec_embedding[j - 2](c))[:, None]
            cos, sin = self.cp_cos[None, p0:p0 + t, None], self.cp_sin[None, p0:p0 + t, None]
            for i, ly in enumerate(self.cp_layers):
                q, k, v = self._qkv(ly, x, cos, sin)
                self.cp_k[i, sl, :, p0:p0 + t] = k
                self.cp_v[i, sl, :, p0:p0 + t] = v
                o = self._attend(ly, q, self.cp_k[i, sl, :, :p0 + t],
                                 self.cp_v[i, sl, :, :p0 + t], allowed, causal=t > 1)
                x = self._finish_layer(ly, x, o)
            hid = _rms(x[:, -1], self.cp_norm_w, self.cp_norm_eps, self.fast)
            logits = cp.lm_head[j - 1](hid).float()
            # residual draws never use top-p (top_p is 1): one top-k + Gumbel-max
            c = self._samp(logits, sub_greedy, sub_temp, sub_k, None, noise[:, j - 1], self.KR, False)
            codes.append(c)
        self.frames[sl].copy_(torch.stack(codes, dim=1))

    def _embed_frame(self, frames: torch.Tensor) -> torch.Tensor:
        tk = self.talker
        if self.fast:
            rows = (frames[:, 1:] + self.res_offsets[None]).reshape(-1)
            res = self.res_tables.view(-1, self.D).index_select(0, rows).view(frames.shape[0], self.R, self.D)
            return tk.model.codec_embedding(frames[:, 0]) + res.sum(dim=1)
        out = tk.model.codec_embedding(frames[:, 0])
        for j, table in enumerate(tk.code_predictor.model.codec_embedding, start=1):
            out = out + table(frames[:, j])
        return out

    def part_talker(self, B: int, C: int) -> None:
        """Next input F(frame) + text -> one talker position per row -> ``h_new``, ``logits``."""
        tk = self.talker
        sl = slice(0, B)
        fi, ntr, pos = self.frame_idx[sl], self.n_trailing[sl], self.pos[sl]
        T = self.trailing.shape[1]
        text = self.trailing[sl].gather(
            1, fi.clamp(max=T - 1)[:, None, None].expand(B, 1, self.D))[:, 0]
        text = torch.where((fi < ntr)[:, None], text, self.tts_pad[None])
        x = (self._embed_frame(self.frames[sl]) + text)[:, None]  # [B, 1, D]
        cos, sin = self.cos[pos][:, None, None], self.sin[pos][:, None, None]  # [B, 1, 1, hd]
        allowed = (self.key_idx[None, :C] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, C]
        add_mask = None
        if self.fast:  # built once per step, shared by every layer
            add_mask = torch.zeros(allowed.shape, device=self.device, dtype=self.dtype).masked_fill_(
                ~allowed, _NEG_INF)
        ar = self.ar[sl]
        for i, ly in enumerate(self.layers):
            q, k, v = self._qkv(ly, x, cos, sin)
            kc, vc = self.k_cache[i, sl], self.v_cache[i, sl]
            kc[ar, :, pos] = k[:, :, 0]
            vc[ar, :, pos] = v[:, :, 0]
            o = self._attend(ly, q, kc[:, :, :C], vc[:, :, :C], allowed, add_mask=add_mask)
            x = self._finish_layer(ly, x, o)
        hn = _rms(x[:, 0], self.norm_w, self.norm_eps, self.fast)
        self.h_new[sl].copy_(hn)
        self.logits[sl].copy_(tk.codec_logits(hn).float())

    def part_sample(self, B: int, top_p: bool = True) -> None:
        """Codebook-0 processing + sampling on ``logits``; advances every state row; ``out``.
        ``top_p=False``: the top-p filter is left out (valid when every sampled row has
        ``top_p == 1``; chosen on the host, so no device read)."""
        sl = slice(0, B)
        ngen = self.ngen[sl]
        c0n = self.sample_c0(B, self.logits[sl], ngen, top_p)
        self.out[sl, :self.G].copy_(self.frames[sl])
        self.out[sl, self.G].copy_((c0n == self.eos).to(torch.int64))
        self.presence[sl].scatter_(1, c0n[:, None], True)
        self.h[sl].copy_(self.h_new[sl])
        self.c0[sl].copy_(c0n)
        live = self.live[sl]  # free (padding) rows keep their counters at 0
        self.ngen[sl].add_(live)
        self.frame_idx[sl].add_(live)
        self.pos[sl].add_(live)

    def step(self, B: int, C: int, top_p: bool = True) -> None:
        self.part_code_predictor(B)
        self.part_talker(B, C)
        self.part_sample(B, top_p)


# ------------------------------------------------------------------------------------------------
# Graphs
# ------------------------------------------------------------------------------------------------

class _Graphs:
    """CUDA graphs keyed by tuples (a decode step per ``(B, C, top_p)``, a prefill per
    ``("prefill", P, L)``), all sharing one memory pool: every graph writes its results to
    static buffers allocated outside the pool, and replays never overlap (one stream)."""

    def __init__(self, model: NativeModel):
        self.model = model
        self.graphs: Dict[tuple, "torch.cuda.CUDAGraph"] = {}
        self.pool = None

    @torch.inference_mode()
    def capture(self, fn, keys, order=None) -> float:
        """Warm up (twice; compiles, cuBLAS handles, allocator) and capture ``fn(*key)`` for every
        key, largest first (``order``: the sort key) so later graphs reuse the pool."""
        t0 = time.perf_counter()
        m = self.model
        stream = torch.cuda.Stream(device=m.device)
        stream.wait_stream(torch.cuda.current_stream(m.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                for k in keys:
                    fn(*k)
        torch.cuda.current_stream(m.device).wait_stream(stream)
        torch.cuda.synchronize(m.device)
        for k in sorted(keys, key=order or (lambda k: tuple(-x for x in k))):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                fn(*k)
            if self.pool is None:
                self.pool = g.pool()
            self.graphs[k] = g
        torch.cuda.synchronize(m.device)
        m.reset_all()  # warm-up mutated the state tables
        return time.perf_counter() - t0

    def replay(self, key) -> None:
        self.graphs[key].replay()


# ------------------------------------------------------------------------------------------------
# Engine
# ------------------------------------------------------------------------------------------------

@dataclass(eq=False)
class _Req:
    req: TalkerRequest
    prompt: torch.Tensor
    trailing: torch.Tensor
    key: int
    queue: asyncio.Queue
    slot: int = -1
    pos: int = 0          # host mirror of the next talker position
    frames: int = 0
    done: bool = False
    aborted: bool = False
    freed: Optional[asyncio.Event] = None
    t_submit: float = field(default_factory=time.perf_counter)

    @property
    def uses_top_p(self) -> bool:
        return not self.req.greedy and self.req.top_p < 1.0


_END = object()


class NativeEngine:
    """Async native talker engine. ``engine = await NativeEngine.create(ckpt, cfg)``."""

    def __init__(self, checkpoint_dir, config: NativeEngineConfig = NativeEngineConfig(), talker=None):
        if not isinstance(config, NativeEngineConfig):
            raise EngineError("config must be a NativeEngineConfig")
        if config.device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineError(f"NativeEngineConfig.device={config.device!r} but CUDA is not available")
        self.config = config
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self._talker = talker
        self.model: Optional[NativeModel] = None
        self.graphs: Optional[_Graphs] = None
        self.capture_seconds = 0.0
        self._waiting: deque = deque()
        self._active: List[_Req] = []
        self._by_id: Dict[str, _Req] = {}
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None
        self._closed = False
        self._error: Optional[BaseException] = None
        self._rng = random.Random(config.seed)
        self.steps = 0
        self.step_hist: Dict[Tuple[int, int], int] = {}
        self.prefill_hist: Dict[Tuple[int, int, bool], int] = {}  # (P, L, graph) -> calls
        self.pf_graphs = False  # prefill graphs captured (keys ("prefill", P, L) in graphs)

    @classmethod
    async def create(cls, checkpoint_dir, config: NativeEngineConfig = NativeEngineConfig(),
                     talker=None) -> "NativeEngine":
        """Load the weights (``talker`` may pass an already loaded reference Talker), allocate
        the slots, capture the graphs and start the scheduler."""
        eng = cls(checkpoint_dir, config, talker)
        await eng.start()
        return eng

    def _load(self):
        c = self.config
        tts_pad_id = None
        talker = self._talker
        if talker is None:
            from .checkpoint import load_checkpoint

            ck = load_checkpoint(self.checkpoint_dir, device=c.device, dtype=c.torch_dtype,
                                 load_speech_tokenizer=False, load_tokenizer=False)
            talker = ck.model.talker
            tts_pad_id = ck.config.tts_pad_token_id
            ck.model.speaker_encoder = None
        else:
            talker = talker.to(device=c.device, dtype=c.torch_dtype)
        if tts_pad_id is None:
            if self.checkpoint_dir is not None:
                from .checkpoint import load_talker_config
                tts_pad_id = load_talker_config(self.checkpoint_dir).tts_pad_token_id
            else:
                tts_pad_id = 151671
        talker.eval()
        for p in talker.parameters():
            p.requires_grad_(False)
        self.model = NativeModel(talker, c, tts_pad_id)
        if c.use_graphs:
            self.graphs = _Graphs(self.model)
            tps = (False, True) if c.skip_top_p else (True,)
            keys = [(b, cc, tp) for b in c.batch_sizes() for cc in c.ctx_sizes() for tp in tps]
            self.capture_seconds = self.graphs.capture(
                self.model.step, keys, order=lambda k: (-k[0], -k[1], k[2]))
            if c.use_prefill_graphs:
                m = self.model
                keys = [("prefill", p, L) for L in c.prefill_len_sizes() for p in c.batch_sizes()
                        if p * L <= c.prefill_max_tokens]
                m.pf_x.zero_()
                m.pf_slots.fill_(m.SCR)  # warm-up and capture write the scratch slot only
                m.pf_last.zero_()
                self.capture_seconds += self.graphs.capture(
                    lambda _, p, L: m.prefill_rows(p, L), keys, order=lambda k: (-k[1] * k[2], -k[1]))
                self.pf_graphs = True

    async def start(self) -> None:
        if self._task is not None:
            return
        if self.model is None:
            await asyncio.get_running_loop().run_in_executor(None, self._load)
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._scheduler())

    # -- requests ----------------------------------------------------------------------------
    @property
    def hidden(self) -> int:
        return self.model.D

    def check_request(self, req: TalkerRequest):
        """Refuse what cannot run, before anything is scheduled. Returns (embeds, trailing)."""
        c = self.config
        if not isinstance(req, TalkerRequest):
            raise EngineError(f"expected a TalkerRequest, got {type(req).__name__}")
        if not isinstance(req.request_id, str) or not req.request_id:
            raise EngineError("request_id must be a non-empty string")
        pe, tr = check_prompt_frames_trailing(req, self.model.D, c.max_model_len, c.max_trailing_tokens)
        sub_greedy = req.greedy if req.sub_greedy is None else req.sub_greedy
        if not (sub_greedy or (req.sub_temperature > 0 and math.isfinite(req.sub_temperature))):
            raise EngineError("sub_temperature must be > 0 unless sub_greedy", field="temperature")
        for name, v, vocab in (("top_k", req.top_k, self.model.V), ("sub_top_k", req.sub_top_k, self.model.cpV)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise EngineError(f"{name} must be an int >= 1, got {v!r}", field="top_k")
            if v > c.max_top_k and c.max_top_k < vocab:
                raise EngineError(f"{name}={v} > max_top_k={c.max_top_k} (NativeEngineConfig)", field="top_k")
        if not (0 < req.top_p <= 1):
            raise EngineError(f"top_p must be in (0, 1], got {req.top_p!r}", field="top_p")
        if not (req.repetition_penalty > 0 and math.isfinite(req.repetition_penalty)):
            raise EngineError(f"repetition_penalty must be > 0, got {req.repetition_penalty!r}",
                              field="repetition_penalty")
        if not isinstance(req.min_new_tokens, int) or req.min_new_tokens < 0:
            raise EngineError(f"min_new_tokens must be an int >= 0, got {req.min_new_tokens!r}",
                              field="min_new_tokens")
        if req.seed is not None and (not isinstance(req.seed, int) or isinstance(req.seed, bool)):
            raise EngineError(f"seed must be an int or None, got {req.seed!r}", field="seed")
        return pe, tr

    async def synthesize(self, req: TalkerRequest) -> AsyncIterator[np.ndarray]:
        """Yield frames ``[n, 16] int32`` as they are produced (the EOS frame is never included)."""
        if self._task is None or self._closed:
            raise EngineError("engine not started (await engine.start()) or shut down")
        if self._error is not None:
            raise RuntimeError(f"native engine failed: {self._error!r}")
        pe, tr = self.check_request(req)
        if req.request_id in self._by_id:
            raise EngineError(f"request_id {req.request_id!r} is already in flight")
        seed = req.seed if req.seed is not None else self._rng.getrandbits(63)
        r = _Req(req=req, prompt=pe, trailing=tr, key=hash_seed(seed), queue=asyncio.Queue())
        self._by_id[req.request_id] = r
        self._waiting.append(r)
        self._wake.set()
        finished = False
        try:
            while True:
                item = await r.queue.get()
                chunks = [item]
                while not r.queue.empty():
                    chunks.append(r.queue.get_nowait())
                frames = []
                for it in chunks:
                    if it is _END:
                        finished = True
                    elif isinstance(it, BaseException):
                        finished = True
                        raise it
                    else:
                        frames.append(it)
                if frames:
                    yield np.concatenate(frames).astype(np.int32, copy=False)
                if finished:
                    return
        finally:
            if not finished and not r.done:
                await self.abort(req.request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a request; returns once its slot is free (no-op for unknown ids)."""
        r = self._by_id.get(request_id)
        if r is None or r.done:
            return
        r.aborted = True
        if r in self._waiting:  # not handed to the scheduler yet (the deque is loop-owned)
            self._waiting.remove(r)
            self._finish(r)
            return
        if r.freed is None:
            r.freed = asyncio.Event()
        self._wake.set()
        if self._task is not None and not self._task.done():
            await r.freed.wait()

    def stats(self) -> dict:
        return {"active": len(self._active), "free": self.config.max_num_seqs - len(self._active),
                "waiting": len(self._waiting), "tracked": len(self._by_id), "steps": self.steps}

    def shutdown(self) -> None:
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        for r in list(self._by_id.values()):
            if not r.done:
                r.queue.put_nowait(EngineError("engine shut down"))
                self._finish(r)
        self._task = None

    # -- scheduler ---------------------------------------------------------------------------
    def _finish(self, r: _Req) -> None:
        if r.done:
            return
        r.done = True
        self._by_id.pop(r.req.request_id, None)
        r.queue.put_nowait(_END)
        if r.freed is not None:
            r.freed.set()

    def _release(self, r: _Req) -> None:
        """Free ``r``'s slot, keeping active slots contiguous (move the last one into the hole)."""
        m = self.model
        s = r.slot
        last = len(self._active) - 1
        moved = self._active[last]
        if moved is not r:
            m.move_slot(last, s, moved.pos)
            moved.slot = s
            self._active[s] = moved
        self._active.pop()
        m.reset_slot(last)
        r.slot = -1

    @torch.inference_mode()
    def _admit_many(self, rs: List[_Req]) -> List[bool]:
        """Put ``rs`` into the next free slots and prefill them, batched (groups within
        ``prefill_max_tokens``). Returns, per request, whether its first c0 is already EOS (one
        host sync for the whole admission)."""
        m = self.model
        a, P = len(self._active), len(rs)
        m.reset_rows(a, a + P)
        cols: Dict[torch.Tensor, list] = {t: [] for t in (
            m.n_trailing, m.key, m.greedy, m.sub_greedy, m.suppress_eos, m.min_new, m.temp, m.top_k,
            m.top_p, m.rep, m.sub_temp, m.sub_top_k, m.pos, m.live)}
        for i, r in enumerate(rs):
            req = r.req
            sub_greedy = req.greedy if req.sub_greedy is None else req.sub_greedy
            n_tr = r.trailing.shape[0]
            if n_tr:
                m.trailing[a + i, :n_tr] = r.trailing.to(m.device, m.dtype)
            L = r.prompt.shape[0]
            for t, v in ((m.n_trailing, n_tr), (m.key, r.key), (m.greedy, bool(req.greedy)),
                         (m.sub_greedy, bool(sub_greedy)), (m.suppress_eos, bool(req.suppress_eos)),
                         (m.min_new, int(req.min_new_tokens)), (m.temp, float(req.temperature)),
                         (m.top_k, min(int(req.top_k), m.K0)), (m.top_p, float(req.top_p)),
                         (m.rep, float(req.repetition_penalty)), (m.sub_temp, float(req.sub_temperature)),
                         (m.sub_top_k, min(int(req.sub_top_k), m.KR)), (m.pos, L), (m.live, 1)):
                cols[t].append(v)
            r.slot, r.pos = a + i, L
            self._active.append(r)
        for t, v in cols.items():  # one copy per table
            t[a:a + P].copy_(torch.tensor(v, dtype=t.dtype))
        i = 0
        for group in self._prefill_groups(rs):
            self._prefill(a + i, group)
            i += len(group)
        return [int(c) == m.eos for c in m.c0[a:a + P].cpu()]

    def _pf_key(self, P: int, L: int):
        """The captured prefill bucket ``("prefill", Pb, Lb)`` for P prompts of at most L rows,
        or None (eager)."""
        c = self.config
        if self.graphs is None or not self.pf_graphs:
            return None
        Ls = [b for b in c.prefill_len_sizes() if b >= L]
        Ps = [b for b in c.batch_sizes() if b >= P]
        if not Ls or not Ps:
            return None
        key = ("prefill", Ps[0], Ls[0])
        return key if key in self.graphs.graphs else None

    def _pf_fits(self, P: int, L: int) -> bool:
        if self.graphs is not None and self.pf_graphs:
            return self._pf_key(P, L) is not None  # grow a group only while a graph covers it
        return P * L <= self.config.prefill_max_tokens

    def _prefill_groups(self, rs: List[_Req]) -> List[List[_Req]]:
        """Consecutive groups that fit ``prefill_max_tokens`` padded rows (with prefill graphs:
        that a captured bucket covers; a single longer prompt prefills eagerly); one request per
        group with ``batched_prefill`` off."""
        c = self.config
        groups: List[List[_Req]] = []
        cur: List[_Req] = []
        cur_L = 0
        for r in rs:
            L = int(r.prompt.shape[0])
            if cur and (not c.batched_prefill or not self._pf_fits(len(cur) + 1, max(cur_L, L))):
                groups.append(cur)
                cur, cur_L = [], 0
            cur.append(r)
            cur_L = max(cur_L, L)
        if cur:
            groups.append(cur)
        return groups

    def _prefill(self, s0: int, group: List[_Req]) -> None:
        """One batched prefill of ``group`` into slots ``s0, s0 + 1, ...``: a graph replay of its
        (P, L) bucket, or eager at the exact padded size."""
        m = self.model
        P = len(group)
        Lmax = max(int(r.prompt.shape[0]) for r in group)
        key = self._pf_key(P, Lmax)
        Pb, Lb = (key[1], key[2]) if key is not None else (P, Lmax)
        x = torch.zeros(Pb, Lb, m.D, dtype=m.dtype)
        for i, r in enumerate(group):
            x[i, :r.prompt.shape[0]] = r.prompt.to(m.dtype)
        m.pf_x[:Pb * Lb * m.D].copy_(x.view(-1))
        slots = [s0 + i for i in range(P)] + [m.SCR] * (Pb - P)
        last = [int(r.prompt.shape[0]) - 1 for r in group] + [0] * (Pb - P)
        m.pf_slots[:Pb].copy_(torch.tensor(slots, dtype=torch.int64))
        m.pf_last[:Pb].copy_(torch.tensor(last, dtype=torch.int64))
        if key is not None:
            self.graphs.replay(key)
        else:
            m.prefill_rows(Pb, Lb)
        k = (Pb, Lb, key is not None)
        self.prefill_hist[k] = self.prefill_hist.get(k, 0) + 1

    def _bucket(self, sizes, n):
        for b in sizes:
            if b >= n:
                return b
        raise RuntimeError(f"no bucket for {n}")

    @torch.inference_mode()
    def _run_step(self) -> np.ndarray:
        """One decode step of every active slot; returns ``out[:n]`` on the host (the sync)."""
        c = self.config
        n = len(self._active)
        B = self._bucket(c.batch_sizes(), n)
        need = max(r.pos for r in self._active) + 1
        C = self._bucket(c.ctx_sizes(), need)
        # top-p only when some sampled row asks for it (host-side request params: no device read)
        tp = not c.skip_top_p or any(r.uses_top_p for r in self._active)
        if self.graphs is not None:
            self.graphs.replay((B, C, tp))
        else:
            self.model.step(B, C, tp)
        self.steps += 1
        self.step_hist[(B, C)] = self.step_hist.get((B, C), 0) + 1
        return self.model.out[:n].cpu().numpy()

    def _work(self, admits: List[_Req]) -> List[Tuple[_Req, Optional[np.ndarray], bool]]:
        """Scheduler body, run off the event loop: releases, admissions, one decode step.
        Returns ``(request, frames [1, 16] or None, finished)`` events for the loop to dispatch."""
        events = []
        for r in [r for r in self._active if r.aborted]:  # releases happen between steps only
            self._release(r)
            events.append((r, None, True))
        live = []
        for r in admits:
            if r.aborted:
                events.append((r, None, True))
            else:
                live.append(r)
        if live:
            for r, eos in zip(live, self._admit_many(live)):
                if eos:  # the first c0 is EOS: no frames
                    self._release(r)
                    events.append((r, None, True))
        if not self._active:
            return events
        out = self._run_step()
        for i, r in enumerate(list(self._active)):
            r.frames += 1
            r.pos += 1
            row = out[i]
            stop = bool(row[-1]) or r.frames >= r.req.max_frames
            events.append((r, row[None, :-1], stop))
        for r, _, stop in events:
            if stop and r.slot >= 0:
                self._release(r)
        return events

    async def _scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                if not self._active and not self._waiting:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                admits = []
                while self._waiting and len(self._active) + len(admits) < self.config.max_num_seqs:
                    admits.append(self._waiting.popleft())
                events = await loop.run_in_executor(None, self._work, admits)
                for r, frames, stop in events:
                    if frames is not None and not r.aborted:
                        r.queue.put_nowait(frames)
                    if stop:
                        self._finish(r)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 -- fail every stream, keep the message
            self._error = e
            for r in list(self._by_id.values()):
                r.queue.put_nowait(RuntimeError(f"native engine step failed: {e!r}"))
                self._finish(r)
            raise
