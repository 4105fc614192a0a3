"""The talker + code predictor as fused weights and slot tables on one device (:class:`NativeModel`)."""

from __future__ import annotations


import torch
import torch.nn.functional as F


from triton_qwen3_tts.engines.base import EngineError
from triton_qwen3_tts.engines.native import kernels as nk
from triton_qwen3_tts.engines.native.config import NativeEngineConfig
from triton_qwen3_tts.engines.native.layers import (
    _NEG_INF,
    CP_POSITIONS,
    _Layer,
    _attn_math,
    _compiled,
    _post_attn,
    _pre_attn,
    _qk_rope,
    _rms,
    _rope_tables,
    _sample_ids,
)
from triton_qwen3_tts.engines.rng import _gumbel


class NativeModel:
    """Weights (taken from the reference :class:`~triton_qwen3_tts.model.talker.Talker`), static
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
            if (
                hasattr(mod, "inv_freq")
                and hasattr(mod, "_inv_freq")
                and (mod.inv_freq.is_meta or mod.inv_freq.device != dev)
            ):
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
        self.frame_idx = z(S1)  # frames emitted so far == index of the frame being built
        self.pos = z(S1)  # talker position the next input is written at
        self.ngen = z(S1)  # c0 tokens sampled so far
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
        self.sub_top_p = torch.ones(S1, device=dev, dtype=torch.float32)
        self.live = z(S1)  # 1 while the slot holds a request: the step's counter increment
        self.state = [
            self.h,
            self.c0,
            self.frame_idx,
            self.pos,
            self.ngen,
            self.presence,
            self.trailing,
            self.n_trailing,
            self.key,
            self.greedy,
            self.sub_greedy,
            self.suppress_eos,
            self.min_new,
            self.temp,
            self.top_k,
            self.top_p,
            self.rep,
            self.sub_temp,
            self.sub_top_k,
            self.sub_top_p,
            self.live,
        ]
        # the state tables by dtype: a slot's reset or move is one multi-tensor op per dtype
        # (4) instead of one kernel launch per table (21), host time the loop spends per release
        groups: dict = {}
        for t in self.state:
            groups.setdefault(t.dtype, []).append(t)
        self._state_groups = list(groups.values())
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
                _compiled(f, cfg.compile_backend) for f in (_pre_attn, _post_attn, _gumbel, _sample_ids)
            )
        special = torch.zeros(self.V, dtype=torch.bool, device=dev)
        special[self.cb :] = True
        special[self.eos] = False
        self.special = special
        eos_hot = torch.zeros(self.V, dtype=torch.bool, device=dev)
        eos_hot[self.eos] = True
        self.eos_hot = eos_hot
        with torch.inference_mode():
            self.tts_pad = talker.embed_text(torch.tensor([tts_pad_token_id], device=dev))[0].clone()
            # RoPE tables (cos, sign-folded sin), gathered by position instead of recomputed
            self.cos, self.sin = _rope_tables(talker.model.rotary_emb, M, dev, dt)  # [M, hd]
            self.cp_cos, self.cp_sin = _rope_tables(
                talker.code_predictor.model.rotary_emb, CP_POSITIONS, dev, dt
            )  # [16, hd]
        self.layers = [_Layer(l) for l in talker.model.layers]
        self.cp_layers = [_Layer(l) for l in talker.code_predictor.model.layers]
        self.norm_w = talker.model.norm.weight
        self.norm_eps = float(talker.model.norm.eps)
        self.cp_norm_w = talker.code_predictor.model.norm.weight
        self.cp_norm_eps = float(talker.code_predictor.model.norm.eps)
        self.fused = cfg.fuse_weights
        self.triton_kernels = cfg.kernels == "triton"
        if self.triton_kernels:
            nk.set_pdl(cfg.pdl)  # before the self-test, which turns it off where Triton lacks it
            nk.SPLIT_K_TARGET = cfg.split_k
            why = nk.unavailable_reason(torch.device(dev))
            if why is None:
                why = nk.self_test(torch.device(dev), self.dtype)
            if why:
                raise EngineError(f"NativeEngineConfig.kernels='triton': {why}; use kernels='torch'")
            # the norm weights folded into the GEMMs that follow them (kernels.fold_norm): per
            # layer of the code predictor and the talker (q/k/v, gate/up), and per residual head
            # (the final norm); a second copy of those weights, 2.0 GB at 1.7B in bf16
            with torch.no_grad():
                self.cp_folded, self.tk_folded = _folded(self.cp_layers), _folded(self.layers)
                self.cp_heads = [nk.fold_norm(h.weight, self.cp_norm_w) for h in talker.code_predictor.lm_head]
                # the residual tables that feed the next residual step, through the projection
                # to the code predictor's width once (fp32, rounded as a GEMM's output): the
                # next step's input is then a row gather, not a GEMM per residual step (1.7B: 14
                # x 2,048 x 1,024, 59 MB in bf16); None where the projection is the identity
                proj = talker.code_predictor.small_to_mtp_projection
                self.cp_next_tables = None
                if getattr(proj, "weight", None) is not None:
                    bias = proj.bias.float() if proj.bias is not None else None
                    self.cp_next_tables = [
                        F.linear(e.weight.float(), proj.weight.float(), bias).to(proj.weight.dtype)
                        for e in talker.code_predictor.model.codec_embedding[: self.R - 1]
                    ]
        if self.fast:  # the 15 residual tables stacked; the modules keep views of it (no copy)
            tables = talker.code_predictor.model.codec_embedding
            with torch.no_grad():
                self.res_tables = torch.stack([e.weight.detach() for e in tables])
            for j, e in enumerate(tables):
                e.weight = torch.nn.Parameter(self.res_tables[j], requires_grad=False)
            self.res_offsets = torch.arange(self.R, device=dev) * self.cpV

    # -- slot management --------------------------------------------------------------------
    def reset_slot(self, s: int) -> None:
        for g in self._state_groups:
            torch._foreach_zero_([t[s] for t in g])

    def reset_all(self) -> None:
        for t in self.state:
            t.zero_()

    def reset_rows(self, a: int, b: int) -> None:
        for g in self._state_groups:
            torch._foreach_zero_([t[a:b] for t in g])

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src`` (KV positions ``[0, length)`` and every state row) onto ``dst``."""
        self.k_cache[:, dst, :, :length].copy_(self.k_cache[:, src, :, :length])
        self.v_cache[:, dst, :, :length].copy_(self.v_cache[:, src, :, :length])
        for g in self._state_groups:
            torch._foreach_copy_([t[dst] for t in g], [t[src] for t in g])

    # -- layers ------------------------------------------------------------------------------
    def _qkv(self, ly: _Layer, x, cos, sin, fn=None):
        """cos/sin ``[b or 1, t, 1, hd]`` (rows of the RoPE tables); ``fn``: the block function
        (default: the decode step's, compiled with ``compile``)."""
        return (fn or self._pre)(
            x, ly.ln1, ly.wqkv, ly.qk_w, cos, sin, ly.eps, ly.heads, ly.kv_heads, ly.head_dim, self.fast, self.fused
        )

    def _finish_layer(self, ly: _Layer, x, attn_out, fn=None):
        return (fn or self._post)(x, attn_out, ly.wo, ly.ln2, ly.wgu, ly.wdown, ly.eps, ly.inter, self.fast, self.fused)

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
            return _decode_sdpa(a, q, k, v, add_mask).reshape(q.shape[0], a.heads, 1, a.head_dim)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def _decode_mask(self, pos: torch.Tensor, C: int, additive: bool):
        """The talker decode step's mask over ``C`` context positions for rows at ``pos [B]``:
        bool ``allowed [B, 1, 1, C]`` (key <= pos) and, with ``additive``, its additive form
        (0 / -inf, the model dtype; else None), built once per step and shared by every layer."""
        allowed = (self.key_idx[None, :C] <= pos[:, None])[:, None, None, :]
        add_mask = None
        if additive:
            add_mask = torch.zeros(allowed.shape, device=self.device, dtype=self.dtype).masked_fill_(~allowed, _NEG_INF)
        return allowed, add_mask

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
        x = self.pf_x[: P * Lb * D].view(P, Lb, D)
        slots, last = self.pf_slots[:P], self.pf_last[:P]
        cos, sin = self.cos[None, :Lb, None], self.sin[None, :Lb, None]
        if self.triton_kernels and P * Lb <= self.cfg.prefill_kernel_rows:
            x = self._prefill_layers_triton(P, Lb, x, cos, sin, slots)
        else:
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
        scores = self.process_c0(
            logits, self.presence[slots], ngen, self.min_new[slots], self.suppress_eos[slots], self.rep[slots]
        )
        c0 = self._sample(
            scores,
            self.greedy[slots],
            self.temp[slots],
            self.top_k[slots],
            self.top_p[slots],
            self.key[slots],
            ngen,
            self.cols0,
            self.K0,
            True,
            plain=True,
        )
        self.c0.index_copy_(0, slots, c0)
        self.presence.index_put_((slots, c0), self.true_)
        self.ngen.index_fill_(0, slots, 1)
        self.pf_c0[:P].copy_(c0)

    def _prefill_layers_triton(self, P: int, Lb: int, x, cos, sin, slots):
        """:meth:`prefill_rows`' talker layers with their GEMMs on :mod:`.kernels`
        (``prefill_kernel_rows``): per layer the q/k/v GEMM with the input norm folded in, q/k
        norm and RoPE (torch, :func:`_qk_rope`), the KV writes, causal SDPA, o-proj + residual,
        gate/up with the post-attention norm folded in + SwiGLU, down + residual. ``x [P, Lb, D]``;
        returns the last layer's output, same shape."""
        D = self.D
        h = x.reshape(P * Lb, D)
        for i, ly in enumerate(self.layers):
            wqkv, wgu = self.tk_folded[i]
            qkv = nk.linear(h, wqkv, rms=True, eps=ly.eps).view(P, Lb, -1)
            q, k, v = _qk_rope(qkv, ly.qk_w, cos, sin, ly.eps, ly.heads, ly.kv_heads, ly.head_dim)
            self.k_cache[i, :, :, :Lb].index_copy_(0, slots, k)
            self.v_cache[i, :, :, :Lb].index_copy_(0, slots, v)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [P, H, Lb, hd]
            h = _post_attn_kernels(ly, wgu, h, o.transpose(1, 2).reshape(P * Lb, -1))
        return h.view(P, Lb, D)

    # -- sampling ----------------------------------------------------------------------------
    def _sample(self, scores, greedy, temp, top_k, top_p, key, counter, cols, K, use_top_p=True, plain=False):
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
        scores = self.process_c0(logits, self.presence[sl], ngen, self.min_new[sl], self.suppress_eos[sl], self.rep[sl])
        return self._sample(
            scores,
            self.greedy[sl],
            self.temp[sl],
            self.top_k[sl],
            self.top_p[sl],
            self.key[sl],
            ngen * CP_POSITIONS,
            self.cols0,
            self.K0,
            use_top_p,
        )

    def sample_residual(self, B: int, logits: torch.Tensor, g: torch.Tensor, use_top_p: bool = True) -> torch.Tensor:
        """One residual codebook's draw for rows ``[0, B)``: the sub-talker's greedy, temperature,
        top-k and top-p (the official ``subtalker_*``) on ``logits [B, cpV]`` with noise ``g [B, KR]``."""
        sl = slice(0, B)
        return self._samp(
            logits,
            self.sub_greedy[sl],
            self.sub_temp[sl],
            self.sub_top_k[sl],
            self.sub_top_p[sl],
            g,
            self.KR,
            use_top_p,
        )

    # -- step parts ----------------------------------------------------------------------------
    def _cp_inputs(self, B: int):
        """The code predictor's start for rows ``[0, B)``: ``c0 [B]``, the noise of all 15
        residual draws (counters 16 * frame + j) in one pass ``[B, 15, KR]``, and the first
        step's input ``[B, 2, Dcp]`` (the projected h and c0 embedding)."""
        tk = self.talker
        sl = slice(0, B)
        c0 = self.c0[sl]
        counters = self.frame_idx[sl, None] * CP_POSITIONS + self.res_draws[None]
        noise = self._noise(self.key[sl], counters, self.colsR)
        x = tk.code_predictor.small_to_mtp_projection(torch.stack([self.h[sl], tk.model.codec_embedding(c0)], dim=1))
        return c0, noise, x

    def part_code_predictor(self, B: int, top_p: bool = True) -> None:
        """(h, c0) -> residual codes; writes ``frames[:B]``. ``top_p=False``: every sampled row
        has ``sub_top_p == 1`` (chosen on the host, as for :meth:`part_sample`)."""
        if self.triton_kernels:
            return self._code_predictor_triton(B, top_p)
        cp = self.talker.code_predictor
        m = cp.model
        sl = slice(0, B)
        c0, noise, x = self._cp_inputs(B)
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
            cos, sin = self.cp_cos[None, p0 : p0 + t, None], self.cp_sin[None, p0 : p0 + t, None]
            for i, ly in enumerate(self.cp_layers):
                q, k, v = self._qkv(ly, x, cos, sin)
                self.cp_k[i, sl, :, p0 : p0 + t] = k
                self.cp_v[i, sl, :, p0 : p0 + t] = v
                o = self._attend(
                    ly, q, self.cp_k[i, sl, :, : p0 + t], self.cp_v[i, sl, :, : p0 + t], allowed, causal=t > 1
                )
                x = self._finish_layer(ly, x, o)
            hid = _rms(x[:, -1], self.cp_norm_w, self.cp_norm_eps, self.fast)
            logits = cp.lm_head[j - 1](hid).float()
            c = self.sample_residual(B, logits, noise[:, j - 1], top_p)
            codes.append(c)
        self.frames[sl].copy_(torch.stack(codes, dim=1))

    def _code_predictor_triton(self, B: int, top_p: bool) -> None:
        """:meth:`part_code_predictor` on the Triton kernels of :mod:`.kernels`: five kernels
        per layer, one for the norm + head and one for the next input (a row gather) per residual
        step."""
        cp = self.talker.code_predictor
        m = cp.model
        sl = slice(0, B)
        c0, noise, x = self._cp_inputs(B)
        x = x.reshape(B * 2, -1)
        codes = [c0]
        for j in range(1, self.R + 1):
            p0, t = (0, 2) if j == 1 else (j, 1)
            for i, ly in enumerate(self.cp_layers):
                wqkv, wgu = self.cp_folded[i]
                qkv = nk.linear(x, wqkv, rms=True, eps=ly.eps)
                o = nk.cp_attention(
                    qkv,
                    ly.qk_w,
                    self.cp_cos,
                    self.cp_sin,
                    self.cp_k[i],
                    self.cp_v[i],
                    p0,
                    t,
                    ly.heads,
                    ly.kv_heads,
                    ly.eps,
                )
                x = _post_attn_kernels(ly, wgu, x, o)
            last = x.view(B, t, -1)[:, -1]
            logits = nk.linear(last, self.cp_heads[j - 1], rms=True, eps=self.cp_norm_eps, out_dtype=torch.float32)
            c = self.sample_residual(B, logits, noise[:, j - 1], top_p)
            codes.append(c)
            if j < self.R:  # the next input: a row of the projected table (or the table itself)
                tables = self.cp_next_tables
                x = (tables[j - 1] if tables is not None else m.codec_embedding[j - 1].weight).index_select(0, c)
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
        text = self.trailing[sl].gather(1, fi.clamp(max=T - 1)[:, None, None].expand(B, 1, self.D))[:, 0]
        text = torch.where((fi < ntr)[:, None], text, self.tts_pad[None])
        x = self._embed_frame(self.frames[sl]) + text  # [B, D]
        if self.triton_kernels:
            return self._talker_triton(B, C, x)
        x = x[:, None]  # [B, 1, D]
        cos, sin = self.cos[pos][:, None, None], self.sin[pos][:, None, None]  # [B, 1, 1, hd]
        allowed, add_mask = self._decode_mask(pos, C, additive=self.fast)  # exact math: the bool mask
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

    def _talker_triton(self, B: int, C: int, x: torch.Tensor) -> None:
        """:meth:`part_talker`'s layers on :mod:`.kernels` (``x [B, D]``, the step's input):
        per layer the q/k/v GEMM with the norm folded in, one kernel for q/k norm + RoPE + the
        KV write, attention over each row's cached positions (:func:`kernels.decode_attention`;
        with ``kernels.DECODE_ATTENTION`` "sdpa", SDPA over the context bucket with the heads of
        each kv group folded into the query length, as the torch fast path), o-proj + residual, gate/up + SwiGLU, down + residual."""
        sl = slice(0, B)
        pos = self.pos[sl]
        sdpa = nk.DECODE_ATTENTION == "sdpa"
        add_mask = self._decode_mask(pos, C, additive=True)[1] if sdpa else None
        for i, ly in enumerate(self.layers):
            wqkv, wgu = self.tk_folded[i]
            qkv = nk.linear(x, wqkv, rms=True, eps=ly.eps)
            kc, vc = self.k_cache[i], self.v_cache[i]
            q = nk.rope_kv_write(qkv, ly.qk_w, self.cos, self.sin, pos, kc, vc, ly.heads, ly.kv_heads, ly.eps)
            if sdpa:
                o = _decode_sdpa(ly, q, kc[sl, :, :C], vc[sl, :, :C], add_mask)
            else:
                o = nk.decode_attention(q, kc, vc, pos, C, ly.heads, ly.kv_heads)
            x = _post_attn_kernels(ly, wgu, x, o.reshape(B, -1))
        hn = _rms(x, self.norm_w, self.norm_eps, True)
        self.h_new[sl].copy_(hn)
        nk.linear(hn, self.talker.codec_head.weight, out=self.logits[sl])

    def part_sample(self, B: int, top_p: bool = True) -> None:
        """Codebook-0 processing + sampling on ``logits``; advances every state row; ``out``.
        ``top_p=False``: the top-p filter is left out (valid when every sampled row has
        ``top_p == 1``; chosen on the host, so no device read)."""
        sl = slice(0, B)
        ngen = self.ngen[sl]
        c0n = self.sample_c0(B, self.logits[sl], ngen, top_p)
        self.out[sl, : self.G].copy_(self.frames[sl])
        self.out[sl, self.G].copy_((c0n == self.eos).to(torch.int64))
        self.presence[sl].scatter_(1, c0n[:, None], True)
        self.h[sl].copy_(self.h_new[sl])
        self.c0[sl].copy_(c0n)
        live = self.live[sl]  # free (padding) rows keep their counters at 0
        self.ngen[sl].add_(live)
        self.frame_idx[sl].add_(live)
        self.pos[sl].add_(live)

    def step(self, B: int, C: int, top_p: bool = True) -> None:
        self.part_code_predictor(B, top_p)
        self.part_talker(B, C)
        self.part_sample(B, top_p)


def _decode_sdpa(a, q, k, v, add_mask):
    """One-row decode attention of layer ``a``: SDPA with the query heads of each kv group folded
    into the query length (``q`` holds ``B x H x hd`` values, head-major), so the call is plain
    multi-head attention (no GQA expansion) that the fused kernels take; ``add_mask [B, 1, 1, Tk]``.
    Returns ``[B, KV, H / KV, hd]``."""
    return F.scaled_dot_product_attention(
        q.reshape(q.shape[0], a.kv_heads, a.heads // a.kv_heads, a.head_dim), k, v, attn_mask=add_mask
    )


def _post_attn_kernels(ly: _Layer, wgu: torch.Tensor, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """A layer's second half on :mod:`.kernels` (the torch blocks' ``_post_attn``): o-proj +
    residual, gate/up with the post-attention norm folded in (``wgu``, :func:`_folded`) + SwiGLU,
    down + residual. ``x [M, D]`` the layer's input rows, ``o [M, H * hd]`` their attention."""
    x = nk.linear(o, ly.wo, residual=x)
    a = nk.linear(x, wgu, rms=True, eps=ly.eps, swiglu=True)
    return nk.linear(a, ly.wdown, residual=x)


def _folded(layers) -> list:
    """``(q/k/v, gate/up)`` weights of each :class:`_Layer` with its input and post-attention norm
    weights folded in (:func:`kernels.fold_norm`), for the Triton kernels."""
    return [(nk.fold_norm(ly.wqkv, ly.ln1), nk.fold_norm(ly.wgu, ly.ln2)) for ly in layers]
