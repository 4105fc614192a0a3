"""Triton kernels of the native engine's decode step (``NativeEngineConfig.kernels = "triton"``).

The code predictor runs 15 sequential forwards of a 5-layer, 1024-wide transformer per frame. In
the torch path (``kernels = "torch"``) each layer is about a dozen kernels (norms, GEMMs, QK
norm, RoPE, two KV writes, SDPA, residual adds, SwiGLU), so a frame is well over a thousand short
kernels whatever the batch. Here each code-predictor layer is five:

1. :func:`linear` with the RMSNorm folded in: ``input_layernorm`` + the fused q/k/v GEMM (the
   norm weight multiplied into the GEMM weight once at load, :func:`fold_norm`; the kernel
   scales each output row by the row's ``1 / rms``);
2. :func:`cp_attention`: q/k RMSNorm, RoPE, the KV-cache write and attention over the (at most
   16) cached positions, one program per (row, kv head);
3. :func:`linear` with a residual epilogue: ``o_proj`` + residual;
4. :func:`linear` with the RMSNorm folded in and a SwiGLU epilogue: ``post_attention_layernorm`` +
   gate/up GEMM + ``silu(gate) * up``;
5. :func:`linear` with a residual epilogue: ``down_proj`` + residual;

and each residual step adds the final norm + ``lm_head`` (one :func:`linear`, fp32 logits) and the
next input (one :func:`linear` gathering the embedding rows of the sampled codes, with the
projection's bias; a plain gather where the projection is the identity).

The talker's layers (one position per row, each row at its own position, context up to the
bucket) use the same :func:`linear` for their four GEMMs, :func:`rope_kv_write` for q/k norm,
RoPE and the KV write, and :func:`decode_attention` (flash-decoding: each row's cached positions
cut into parts run in parallel, then merged) for the attention over the long context, where
PyTorch's SDPA over the masked context bucket took a third of the talker's time at 64 rows
(run 31a: 68 us per layer at 64 rows, against 79 MB of keys and values per layer at context 300,
23 us at the H100's bandwidth).

GEMMs of at most :data:`GEMV_ROWS` rows (one row per stream at batch 1; the code predictor's
first step has two) run on :func:`_gemv_kernel` instead: the tiled kernel is latency-bound at
such sizes (about 1 TB/s of the H200's 4.3: too few loads in flight per multiprocessor), where
the few-row kernel's many small programs each load whole weight rows at once
(run 36d: 4.0-6.8 us per code-predictor GEMM at one row against 6.1-15.7, the frame step at
one row 5.34 -> 3.61 ms).

Arithmetic: fp32 accumulation and fp32 norms/activations, rounded once to the model dtype where
a tensor is stored (the folded weights are rounded once more at load); the torch path rounds
after each op, so bf16 codes can differ where two candidates are near-tied (the share of identical codes is measured by ``benchmark_model.py
--cp-parity``). fp32 models use IEEE fp32 dots (no TF32).

A tiled launch of few output tiles (at most :data:`SPLIT_K_TARGET` programs per multiprocessor:
the code predictor's o_proj, down and head at 4-64 rows) cuts K into parts, programs of their
own (split-K, :func:`k_splits`); the last program of each output tile adds the parts' fp32 sums
in a fixed order and runs the epilogue (run 38a on the H200: the frame step at 4-8 rows 5.8-5.9
-> 5.3-5.4 ms, at 64 rows 5.81 -> 5.67).

On Hopper and newer GPUs the kernels can be launched with programmatic dependent launch (PDL,
:func:`set_pdl`): the next kernel's programs start while the previous one finishes and wait for
it (``gdc_wait``) before they touch anything it may write; with ``"prefetch"`` the GEMMs first
prefetch their weight slice into L2 (weights are never written, so that needs no wait). The
arithmetic is the same in every mode. The default, ``"few"``, uses it only for the kernels of
one-stream steps (at most :data:`GEMV_ROWS` rows): the few-row kernel loads its whole weight
slice before it waits, so that load overlaps the previous kernel (run 37a on the H200: the
one-row frame step 3.59 -> 3.10 ms; 37c: 3.00). With more rows PDL does not pay: on the H100
(run 29b) "on" took the code predictor from 3.55 to 3.30 ms at one row but slowed the talker's
tiled GEMMs (2.70 to 2.94 ms), "prefetch" was slower still, and on the H200 (37a) "on" took the
64-row step from 5.98 to 6.13 ms.

On the CPU the kernels run only in Triton's interpreter (``TRITON_INTERPRET=1``, set before
``triton`` is imported), which is how the tests check them against the torch path; the
interpreter's ``tl.dot`` mishandles bf16 operands, so there the operands are widened to fp32 first
(``_UPCAST``); on a GPU the dot takes the model dtype.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Optional

import torch

from triton_qwen3_tts.engines.native.options import DECODE_ATTENTION_MODES, PDL_MODES

try:  # GPU builds of torch ship triton; CPU test environments get it with vLLM (xgrammar)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

log = logging.getLogger(__name__)

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# programmatic dependent launch on GPUs of compute capability >= 9.0: "off", "on" (each kernel
# waits for the previous one at its start), "prefetch" (the GEMMs prefetch their weights into L2
# before that wait), "few" ("on" for launches of at most GEMV_ROWS rows, "off" for more);
# set_pdl() changes it (before CUDA-graph capture: graphs keep the launches they captured).
# "few": on the H200 (run 37a) "on" took the one-row frame step from 3.59 to 3.10 ms (the
# few-row kernel loads its weights before it waits, so they overlap the previous kernel) but
# the 64-row one from 5.98 to 6.13 (its tiled GEMMs slower, as on the H100 in run 29b)
PDL = "few"
_PDL_DEVICES: dict = {}  # device index -> capability >= 9.0


# linear() with at most this many rows runs on _gemv_kernel (whole weight rows per program, no
# K loop, no tensor cores) instead of _linear_kernel; 0: never. Set before CUDA-graph capture.
# 2: on the H200 (run 36d, cold weights) one row took 4.0-6.8 us per code-predictor GEMM where
# the tiled kernel took 6.1-15.7, each further row about 0.5-3 us more, so 8 rows lost (gate/up
# 23.9 against 10.6 us); one row of the code predictor's first step is two positions
GEMV_ROWS = 2

# the talker's decode attention with kernels "triton": "triton" (decode_attention, reading each
# row's cached positions only) or "sdpa" (PyTorch's SDPA over the whole context bucket with a
# mask); set_decode_attention() changes it (before CUDA-graph capture), for A/B measurements
DECODE_ATTENTION = "triton"


def set_decode_attention(mode: str) -> None:
    """Set :data:`DECODE_ATTENTION` (one of :data:`DECODE_ATTENTION_MODES`)."""
    global DECODE_ATTENTION
    if mode not in DECODE_ATTENTION_MODES:
        raise ValueError(f"decode attention must be one of {', '.join(DECODE_ATTENTION_MODES)}, got {mode!r}")
    DECODE_ATTENTION = mode


def set_pdl(mode: str) -> None:
    """Set :data:`PDL` (one of :data:`PDL_MODES`) for the launches that follow."""
    global PDL
    if mode not in PDL_MODES:
        raise ValueError(f"PDL mode must be one of {', '.join(PDL_MODES)}, got {mode!r}")
    PDL = mode


def pdl_mode(rows: int) -> str:
    """The PDL mode ("off", "on" or "prefetch") of a launch over ``rows`` rows under
    :data:`PDL` ("few": "on" up to :data:`GEMV_ROWS` rows)."""
    if PDL == "few":
        return "on" if rows <= GEMV_ROWS else "off"
    return PDL


def _pdl(t: torch.Tensor, rows: int) -> str:
    """:func:`pdl_mode` of a launch over ``rows`` rows on ``t``'s device ("off" below Hopper,
    off the GPU, in the interpreter)."""
    mode = pdl_mode(rows)
    if mode == "off" or not t.is_cuda or _INTERPRET:
        return "off"
    idx = _cuda_index(t.device)
    if idx not in _PDL_DEVICES:
        _PDL_DEVICES[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return mode if _PDL_DEVICES[idx] else "off"


def _launch_opts(mode: str) -> dict:
    return {"launch_pdl": True} if mode != "off" else {}


def unavailable_reason(device: torch.device) -> Optional[str]:
    """Why the kernels cannot run on ``device`` (None when they can)."""
    if triton is None:
        return "the 'triton' package is not installed"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:  # bf16 dots and the tile shapes assume Ampere or newer
            return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) is older than 8.0"
        return None
    if _INTERPRET:
        return None
    return f"device {device} needs a CUDA GPU (or TRITON_INTERPRET=1 set before triton is imported, for tests)"


def self_test(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Compile and run :func:`linear` once on a small problem and once on one row of it (the
    few-row kernel, :data:`GEMV_ROWS`); Triton compiles a launcher with the system's C compiler
    the first time. The reason it cannot run, or None. Checks the results against torch, so a
    broken toolchain fails the engine's load with a message instead of its first request."""

    def run() -> Optional[str]:
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(3, 64, generator=g).to(device, dtype)
            w = (torch.randn(32, 64, generator=g) * 0.1).to(device, dtype)
            y = linear(x, w, out_dtype=torch.float32)
            ref = x.float() @ w.float().T
            err = float((y - ref).abs().max())
            if GEMV_ROWS >= 1:  # the few-row kernel too, where one row runs on it
                y1 = linear(x[:1], w, out_dtype=torch.float32)
                err = max(err, float((y1 - ref[:1]).abs().max()))
        except Exception as e:  # noqa: BLE001 - any failure to compile or launch is the answer
            return f"the kernels do not compile or run here ({type(e).__name__}: {str(e)[:300]})"
        if not err < 0.05:
            return f"the kernels' self-test result differs from torch by {err:g}"
        return None

    why = run()
    if why is not None and PDL != "off":
        # a Triton without programmatic dependent launch: the kernels still run without it
        set_pdl("off")
        if run() is None:
            log.warning("Triton kernels: programmatic dependent launch off (%s)", why)
            return None
    return why


if triton is not None:

    @triton.jit
    def _dot(a, b, UPCAST: tl.constexpr, IEEE: tl.constexpr):
        """``a @ b`` in fp32: operands widened first in the interpreter (``UPCAST``), IEEE fp32
        products for fp32 models (no TF32)."""
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:
            return tl.dot(a, b, input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _prefetch_rows(w_ptr, rows, K, BK: tl.constexpr, LINE: tl.constexpr):
        """Prefetch weight rows ``rows`` (``K`` elements each) into L2, one address per cache line."""
        for k0 in range(0, K, BK):
            rk = tl.minimum(k0 + tl.arange(0, BK // LINE) * LINE, K - 1)
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
                "=r,l",
                [w_ptr + rows[:, None].to(tl.int64) * K + rk[None, :]],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )

    @triton.jit
    def _linear_kernel(
        x_ptr,
        idx_ptr,
        w_ptr,
        bias_ptr,
        res_ptr,
        out_ptr,
        ws_ptr,
        lock_ptr,
        M,
        N,
        K,
        KS,
        stride_xm,
        stride_rm,
        stride_om,
        eps,
        GATHER: tl.constexpr,
        RMS: tl.constexpr,
        SWIGLU: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_RES: tl.constexpr,
        UPCAST: tl.constexpr,
        IEEE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        SPLIT: tl.constexpr,
        GDC: tl.constexpr,
        PREFETCH: tl.constexpr,
        LINE: tl.constexpr,
    ):
        """out[m, n] = epi(sum_k x[m, k] * w[n, k]); one program per (BN outputs, BM rows, K part).

        RMS: ``w`` holds the norm weight folded in (``w[n, k] * ln[k]``), so the norm is a row
        scale ``1 / rms(x[m])`` of the accumulator, its sum of squares gathered from the same
        x tiles the dot reads (no second pass, nothing between the load and the dot).

        SPLIT > 1 (split-K): program ``(n, m, s)`` sums K elements ``[s * KS, (s + 1) * KS)``
        only and stores its fp32 partial sums (and partial sums of squares) in its slot of the
        workspace ``ws_ptr``; then it counts itself in its output tile's counter
        (``lock_ptr``, an atomic add that releases the stores and acquires the others'). The
        program that arrives last adds the tile's SPLIT partials in slot order (the same sums
        whichever arrives last), resets the counter to zero for the next launch and runs the
        epilogue. No program waits for another.

        GDC (programmatic dependent launch): wait for the previous kernel before reading x, rows,
        bias or residual and before writing out; PREFETCH: first the first row tile's programs
        prefetch this program's weight rows into L2 (one ``LINE``-element cache line per address)."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_k = tl.program_id(2)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        m_ok = rm < M
        n_ok = rn < N
        if PREFETCH:
            if pid_m == 0:
                _prefetch_rows(w_ptr, tl.minimum(rn, N - 1), K, BK, LINE)
                if SWIGLU:
                    _prefetch_rows(w_ptr, tl.minimum(rn, N - 1) + N, K, BK, LINE)
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if GATHER:
            rows = tl.load(idx_ptr + rm, mask=m_ok, other=0).to(tl.int64)
        else:
            rows = rm.to(tl.int64)
        x_rows = x_ptr + rows[:, None] * stride_xm
        ss = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, BN), tl.float32)
        acc2 = tl.zeros((BM, BN), tl.float32)
        k_lo = pid_k * KS
        for k0 in range(k_lo, tl.minimum(k_lo + KS, K), BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < K
            a = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if RMS:
                af = a.to(tl.float32)
                ss += tl.sum(af * af, axis=1)
            b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            acc += _dot(a, b, UPCAST, IEEE)
            if SWIGLU:  # the up rows follow the N gate rows
                b2 = tl.load(w_ptr + (rn[None, :] + N) * K + rk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
                acc2 += _dot(a, b2, UPCAST, IEEE)
        if SPLIT == 1:
            _linear_epilogue(
                acc, acc2, ss, rm, rn, m_ok, n_ok, K, eps, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                RMS, SWIGLU, HAS_BIAS, HAS_RES,
            )  # fmt: skip
        else:
            # a slot: the BM x BN partial sums, the up half's with SwiGLU, then BM sums of squares
            SLOT: tl.constexpr = BM * BN * (2 if SWIGLU else 1) + BM
            tile = pid_m * tl.num_programs(0) + pid_n
            slots = ws_ptr + tl.multiple_of((tile * SPLIT).to(tl.int64) * SLOT, 16)  # 16 | SLOT: vector access
            cell = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
            mine = slots + tl.multiple_of(pid_k * SLOT, 16)
            tl.store(mine + cell, acc)
            if SWIGLU:
                tl.store(mine + BM * BN + cell, acc2)
            if RMS:
                tl.store(mine + (SLOT - BM) + tl.arange(0, BM), ss)
            tl.debug_barrier()  # every thread's stores before the release below
            arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT - 1:
                tot = tl.zeros((BM, BN), tl.float32)
                tot2 = tl.zeros((BM, BN), tl.float32)
                tss = tl.zeros((BM,), tl.float32)
                for s in tl.static_range(SPLIT):  # L2 only (.cg): other multiprocessors wrote them
                    tot += tl.load(slots + s * SLOT + cell, cache_modifier=".cg")
                    if SWIGLU:
                        tot2 += tl.load(slots + s * SLOT + BM * BN + cell, cache_modifier=".cg")
                    if RMS:
                        tss += tl.load(slots + s * SLOT + (SLOT - BM) + tl.arange(0, BM), cache_modifier=".cg")
                tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")
                _linear_epilogue(
                    tot, tot2, tss, rm, rn, m_ok, n_ok, K, eps, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                    RMS, SWIGLU, HAS_BIAS, HAS_RES,
                )  # fmt: skip

    @triton.jit
    def _linear_epilogue(
        acc, acc2, ss, rm, rn, m_ok, n_ok, K, eps, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
        RMS: tl.constexpr, SWIGLU: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
    ):  # fmt: skip
        """:func:`_linear_kernel`'s epilogue on a whole tile's sums: the norm's row scale, bias,
        SwiGLU, residual, the store in out's dtype."""
        if RMS:
            inv = 1.0 / tl.sqrt(ss / K + eps)
            acc = acc * inv[:, None]
            if SWIGLU:
                acc2 = acc2 * inv[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SWIGLU:
            acc = acc / (1.0 + tl.exp(-acc)) * acc2
        mask = m_ok[:, None] & n_ok[None, :]
        if HAS_RES:
            r = tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :], mask=mask, other=0.0)
            acc += r.to(tl.float32)
        tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _gemv_kernel(
        x_ptr,
        idx_ptr,
        w_ptr,
        bias_ptr,
        res_ptr,
        out_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_rm,
        stride_om,
        eps,
        GATHER: tl.constexpr,
        RMS: tl.constexpr,
        SWIGLU: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_RES: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GDC: tl.constexpr,
    ):
        """:func:`_linear_kernel` for a few rows without tensor cores: one program loads ``BN``
        whole weight rows (all of K, ``BK`` its power of two, in one go: no K loop, so one
        memory latency per program instead of one per K tile) and then takes each of the
        ``M`` rows in turn, products and sums in fp32. Small programs, many per
        multiprocessor: the loads in flight are what bounds a decode GEMM's speed.

        GDC (programmatic dependent launch): the weights and bias (never written by a kernel)
        are loaded first, then the program waits for the previous kernel before reading x or
        the residual and writing out, so its weight loads overlap the previous kernel's end."""
        pid = tl.program_id(0)
        rn = pid * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        n_ok = rn < N
        k_ok = rk < K
        wmask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=wmask, other=0.0)
        w2 = w
        if SWIGLU:  # the up rows follow the N gate rows
            w2 = tl.load(w_ptr + (rn[:, None] + N) * K + rk[None, :], mask=wmask, other=0.0)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        for m in range(0, M):
            if GATHER:
                row = tl.load(idx_ptr + m).to(tl.int64)
            else:
                row = tl.cast(m, tl.int64)
            x = tl.load(x_ptr + row * stride_xm + rk, mask=k_ok, other=0.0).to(tl.float32)
            acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            if RMS:
                inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
                acc = acc * inv
            if HAS_BIAS:
                acc += bias
            if SWIGLU:
                acc2 = tl.sum(w2.to(tl.float32) * x[None, :], axis=1)
                if RMS:
                    acc2 = acc2 * inv
                acc = acc / (1.0 + tl.exp(-acc)) * acc2
            if HAS_RES:
                acc += tl.load(res_ptr + m * stride_rm + rn, mask=n_ok, other=0.0).to(tl.float32)
            tl.store(out_ptr + m * stride_om + rn, acc.to(out_ptr.dtype.element_ty), mask=n_ok)

    @triton.jit
    def _cp_attn_kernel(
        qkv_ptr,
        qkw_ptr,
        cos_ptr,
        sin_ptr,
        kc_ptr,
        vc_ptr,
        o_ptr,
        p0,
        stride_qkv,
        stride_o,
        stride_cb,
        stride_ch,
        stride_cp,
        eps,
        scale,
        T: tl.constexpr,
        H: tl.constexpr,
        KVH: tl.constexpr,
        HD: tl.constexpr,
        P: tl.constexpr,
        GDC: tl.constexpr,
    ):
        """One (batch row b, kv head g): the T new rows' k/v normed, roped and written to the
        cache at positions p0..p0+T-1, then the REP query heads of g over keys 0..p0+t.

        Every load is issued at the start, in one round trip: the new rows' q/k/v, the norm
        weights, cos/sin and the cached positions 0..p0-1 (earlier launches wrote them); the
        new rows' keys and values enter the attention from registers, rounded as stored, so no
        load waits for this program's own stores."""
        REP: tl.constexpr = H // KVH
        QR: tl.constexpr = T * REP
        HALF: tl.constexpr = HD // 2
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)
        d = tl.arange(0, HD)
        d_rot = (d + HALF) % HD  # torch.roll by HD/2 (sign folded into sin)
        kw = tl.load(qkw_ptr + (H + g) * HD + d).to(tl.float32)
        kw_rot = tl.load(qkw_ptr + (H + g) * HD + d_rot).to(tl.float32)
        kc = kc_ptr + b * stride_cb + g * stride_ch
        vc = vc_ptr + b * stride_cb + g * stride_ch
        pp = tl.arange(0, P)
        past = (pp < p0)[:, None]
        kk = tl.load(kc + pp[:, None] * stride_cp + d[None, :], mask=past, other=0.0).to(tl.float32)
        vv = tl.load(vc + pp[:, None] * stride_cp + d[None, :], mask=past, other=0.0).to(tl.float32)
        # the new rows' keys and values: [T, HD]
        tt = tl.arange(0, T)
        rows = qkv_ptr + (b * T + tt)[:, None] * stride_qkv
        k = tl.load(rows + (H + g) * HD + d[None, :]).to(tl.float32)
        k_rot = tl.load(rows + (H + g) * HD + d_rot[None, :]).to(tl.float32)
        v = tl.load(rows + (H + KVH + g) * HD + d[None, :]).to(vc_ptr.dtype.element_ty)
        c = tl.load(cos_ptr + (p0 + tt)[:, None] * HD + d[None, :]).to(tl.float32)
        s = tl.load(sin_ptr + (p0 + tt)[:, None] * HD + d[None, :]).to(tl.float32)
        # queries: QR rows (t major, then the REP heads of g)
        qr = tl.arange(0, QR)
        qt = qr // REP
        qh = g * REP + qr % REP
        q_rows = qkv_ptr + (b * T + qt)[:, None] * stride_qkv + (qh * HD)[:, None]
        q = tl.load(q_rows + d[None, :]).to(tl.float32)
        q_rot = tl.load(q_rows + d_rot[None, :]).to(tl.float32)
        qw = tl.load(qkw_ptr + (qh * HD)[:, None] + d[None, :]).to(tl.float32)
        qw_rot = tl.load(qkw_ptr + (qh * HD)[:, None] + d_rot[None, :]).to(tl.float32)
        qc = tl.load(cos_ptr + (p0 + qt)[:, None] * HD + d[None, :]).to(tl.float32)
        qs = tl.load(sin_ptr + (p0 + qt)[:, None] * HD + d[None, :]).to(tl.float32)
        # k: norm, RoPE, the model dtype; written to the cache with v, and into kk/vv
        inv = 1.0 / tl.sqrt(tl.sum(k * k, axis=1) / HD + eps)
        k = ((k * inv[:, None] * kw[None, :]) * c + (k_rot * inv[:, None] * kw_rot[None, :]) * s).to(
            kc_ptr.dtype.element_ty
        )
        tl.store(kc + (p0 + tt)[:, None] * stride_cp + d[None, :], k)
        tl.store(vc + (p0 + tt)[:, None] * stride_cp + d[None, :], v)
        for t in tl.static_range(T):
            sel = (tt == t)[:, None]
            new = (pp == p0 + t)[:, None]
            kk = tl.where(new, tl.sum(tl.where(sel, k.to(tl.float32), 0.0), axis=0)[None, :], kk)
            vv = tl.where(new, tl.sum(tl.where(sel, v.to(tl.float32), 0.0), axis=0)[None, :], vv)
        qinv = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / HD + eps)
        q = (q * qinv[:, None] * qw) * qc + (q_rot * qinv[:, None] * qw_rot) * qs
        q = q.to(kc_ptr.dtype.element_ty).to(tl.float32)  # the model dtype's rounding of q
        scores = tl.sum(q[:, None, :] * kk[None, :, :], axis=2) * scale  # [QR, P]
        allowed = pp[None, :] <= (p0 + qt)[:, None]
        scores = tl.where(allowed, scores, float("-inf"))
        mx = tl.max(scores, axis=1)
        e = tl.exp(scores - mx[:, None])
        e = tl.where(allowed, e, 0.0)
        probs = e / tl.sum(e, axis=1)[:, None]
        out = tl.sum(probs[:, :, None] * vv[None, :, :], axis=1)  # [QR, HD]
        o_rows = o_ptr + (b * T + qt)[:, None] * stride_o + (qh * HD)[:, None]
        tl.store(o_rows + d[None, :], out.to(o_ptr.dtype.element_ty))

    @triton.jit
    def _rope_kv_kernel(
        qkv_ptr,
        qkw_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        kc_ptr,
        vc_ptr,
        q_ptr,
        stride_qkv,
        stride_cb,
        stride_ch,
        stride_cp,
        eps,
        H: tl.constexpr,
        KVH: tl.constexpr,
        HD: tl.constexpr,
        GDC: tl.constexpr,
    ):
        """One (row b, head hh of the H query then KVH key heads): RMSNorm with its q/k norm
        weight and RoPE at the row's position; queries go to ``q [B, H * hd]``, keys (and the
        head's values) into the KV cache at that position."""
        HALF: tl.constexpr = HD // 2
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        hh = tl.program_id(1)
        d = tl.arange(0, HD)
        d_rot = (d + HALF) % HD
        p = tl.load(pos_ptr + b)
        row = qkv_ptr + b * stride_qkv + hh * HD
        x = tl.load(row + d).to(tl.float32)
        xr = tl.load(row + d_rot).to(tl.float32)
        w = tl.load(qkw_ptr + hh * HD + d).to(tl.float32)
        wr = tl.load(qkw_ptr + hh * HD + d_rot).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HD + eps)
        c = tl.load(cos_ptr + p * HD + d).to(tl.float32)
        s = tl.load(sin_ptr + p * HD + d).to(tl.float32)
        y = (x * inv * w) * c + (xr * inv * wr) * s
        if hh < H:
            tl.store(q_ptr + b * (H * HD) + hh * HD + d, y.to(q_ptr.dtype.element_ty))
        else:
            g = hh - H
            at = b * stride_cb + g * stride_ch + p * stride_cp + d
            tl.store(kc_ptr + at, y.to(kc_ptr.dtype.element_ty))
            v = tl.load(qkv_ptr + b * stride_qkv + (H + KVH + g) * HD + d)
            tl.store(vc_ptr + at, v)

    @triton.jit
    def _decode_attn_kernel(
        q_ptr,
        kc_ptr,
        vc_ptr,
        pos_ptr,
        part_ptr,
        o_ptr,
        stride_cb,
        stride_ch,
        stride_cp,
        scale,
        CHUNK,
        H: tl.constexpr,
        KVH: tl.constexpr,
        HD: tl.constexpr,
        RP: tl.constexpr,
        QB: tl.constexpr,
        BLOCK: tl.constexpr,
        SPLITS: tl.constexpr,
        UPCAST: tl.constexpr,
        IEEE: tl.constexpr,
        GDC: tl.constexpr,
    ):
        """One (row b, kv head g, split s): the REP query heads of g (a ``QB``-row tile, the
        rest zero, for the tensor-core dots) over the row's cached positions ``s * CHUNK ..``
        up to ``min((s + 1) * CHUNK, pos[b] + 1)``, ``BLOCK`` at a time, online softmax in fp32
        (the probabilities rounded to the model dtype for the second dot, as flash attention
        does). One split: the normalised output into ``o``; more: the split's running max, sum
        and unnormalised output (``RP`` rows) into ``part`` for :func:`_decode_combine_kernel`."""
        REP: tl.constexpr = H // KVH
        W: tl.constexpr = HD + 2  # one part row: HD outputs, the max, the sum
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)
        sp = tl.program_id(2)
        r = tl.arange(0, QB)
        r_ok = r < REP
        d = tl.arange(0, HD)
        length = tl.load(pos_ptr + b) + 1
        start = sp * CHUNK
        end = tl.minimum(start + CHUNK, length)
        q_at = b * (H * HD) + (g * REP + r)[:, None] * HD + d[None, :]
        q = tl.load(q_ptr + q_at, mask=r_ok[:, None], other=0.0)
        m = tl.full((QB,), float("-inf"), tl.float32)
        l_sum = tl.zeros((QB,), tl.float32)
        acc = tl.zeros((QB, HD), tl.float32)
        kc = kc_ptr + b * stride_cb + g * stride_ch
        vc = vc_ptr + b * stride_cb + g * stride_ch
        for n0 in range(start, end, BLOCK):
            n = n0 + tl.arange(0, BLOCK)
            n_ok = n < end
            kt = tl.load(kc + n[None, :] * stride_cp + d[:, None], mask=n_ok[None, :], other=0.0)  # [HD, BLOCK]
            sc = _dot(q, kt, UPCAST, IEEE) * scale  # [QB, BLOCK]
            sc = tl.where(n_ok[None, :], sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=1))  # finite: every block has a valid position
            alpha = tl.exp(m - m_new)
            pr = tl.exp(sc - m_new[:, None])
            v = tl.load(vc + n[:, None] * stride_cp + d[None, :], mask=n_ok[:, None], other=0.0)  # [BLOCK, HD]
            l_sum = l_sum * alpha + tl.sum(pr, axis=1)
            acc = acc * alpha[:, None] + _dot(pr.to(v.dtype), v, UPCAST, IEEE)
            m = m_new
        if SPLITS == 1:
            out = acc / l_sum[:, None]
            tl.store(o_ptr + q_at, out.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])
        else:
            keep = r < RP
            base = part_ptr + ((b * KVH + g) * SPLITS + sp) * (RP * W) + r * W
            tl.store(base[:, None] + d[None, :], acc, mask=keep[:, None])
            tl.store(base + HD, m, mask=keep)
            tl.store(base + HD + 1, l_sum, mask=keep)

    @triton.jit
    def _decode_combine_kernel(
        part_ptr,
        o_ptr,
        H: tl.constexpr,
        KVH: tl.constexpr,
        HD: tl.constexpr,
        RP: tl.constexpr,
        SPLITS: tl.constexpr,
        GDC: tl.constexpr,
    ):
        """One (row b, kv head g): the splits of :func:`_decode_attn_kernel` merged (each
        rescaled to the largest running max; a split past the row's length has max -inf and
        sum 0, and split 0 is never empty) and normalised into ``o``."""
        REP: tl.constexpr = H // KVH
        W: tl.constexpr = HD + 2
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)
        r = tl.arange(0, RP)
        d = tl.arange(0, HD)
        base = part_ptr + (b * KVH + g) * SPLITS * (RP * W) + r * W
        mx = tl.full((RP,), float("-inf"), tl.float32)
        for sp in tl.static_range(SPLITS):
            mx = tl.maximum(mx, tl.load(base + sp * (RP * W) + HD))
        l_sum = tl.zeros((RP,), tl.float32)
        acc = tl.zeros((RP, HD), tl.float32)
        for sp in tl.static_range(SPLITS):
            at = base + sp * (RP * W)
            f = tl.exp(tl.load(at + HD) - mx)
            l_sum += tl.load(at + HD + 1) * f
            acc += tl.load(at[:, None] + d[None, :]) * f[:, None]
        out = acc / l_sum[:, None]
        r_ok = r < REP
        o_at = b * (H * HD) + (g * REP + r)[:, None] * HD + d[None, :]
        tl.store(o_ptr + o_at, out.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])


def fold_norm(w: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """``w [N, K]`` with an RMSNorm weight ``[K]`` folded in (``w * norm_weight``, computed in
    fp32, stored in w's dtype): the weight :func:`linear` takes with ``rms=True``."""
    return (w.float() * norm_weight.float()[None, :]).to(w.dtype).contiguous()


def tiles(M: int, N: int, K: int, elt: int = 2, swiglu: bool = False, smem: Optional[int] = None) -> tuple:
    """(BM, BN, BK, num_warps, num_stages) of :func:`linear` for an ``M x N x K`` problem of
    ``elt``-byte elements on a GPU with ``smem`` bytes of shared memory per block (None: no bound).

    The decode GEMMs are skinny (M = batch rows, 1-128) and memory-bound: the weight is streamed
    from DRAM once per row tile. The choices are the fastest of the H100 sweep with cold weights
    (``scripts/kernel_sweep.py --cold --configs wide``, run 31b; docs/benchmark-history.md): one
    16-row tile up to 16 rows, 64-row tiles above (32-row tiles made batch 32 slower than batch 64,
    run 28). Up to 16 rows: 32-wide N tiles and 256-deep K tiles, 4 pipeline stages where K is
    deep and N narrow (o_proj, down), and 64 x 128 tiles for the talker's wide gate/up. Above 16
    rows: 16-wide N tiles where N is narrow for its K (more programs for o_proj and down), 8 warps
    on 32 x 128 tiles for the wide projections, 64 x 128 for the talker's gate/up; in one row
    tile (17-64 rows) weights of at least 6 Mi elements (the 1.7B talker's q/k/v, down and
    head) take 64 x 128 tiles, 4 warps and 4 stages, the programs refilled by split-K
    (:func:`k_splits`; not with it off): half or a quarter of the input re-reads from L2 (run
    38i on the H200: 11.2 -> 10.6, 13.5 -> 12.0 and 10.9 -> 10.1 us).
    The pipeline buffers ``stages x (BM x BK + BK x BN per weight tile)`` elements (two weight
    tiles with ``swiglu``); where that exceeds ``smem`` (smaller GPUs than the H100, fp32),
    stages and then K depth are cut until it fits."""
    deep = 256 if K % 256 == 0 else (128 if K % 128 == 0 else 64)
    narrow = N <= 1024 or (N <= 2048 and K >= 2048)  # few output tiles for the weight's size
    warps = 4
    if M <= 16:
        BM = 16
        if swiglu and N >= 4096:
            BN, BK, stages = 64, min(deep, 128), 4
        else:
            BN, BK, stages = 32, deep, (4 if narrow and not swiglu else 3)
    else:
        BM = 64
        if swiglu:
            BN, BK, stages = (64 if N >= 4096 else 32), min(deep, 128), (4 if N >= 4096 else 3)
        elif M <= 64 and N * K >= 6 << 20 and SPLIT_K_TARGET > 0:  # without split-K: too few programs
            BN, BK, stages = 64, min(deep, 128), 4
        elif narrow:
            BN, BK = 16, (deep if K >= 3072 else min(deep, 128))
            stages = 5 if BK == 128 or K >= 4096 else 4
        else:
            BN, BK, warps, stages = 32, min(deep, 128), 8, 4
    if smem is not None:
        need = lambda st, bk: st * (BM * bk + (2 if swiglu else 1) * bk * BN) * elt  # noqa: E731
        while need(stages, BK) > smem and (stages > 2 or BK > 32):
            if stages > 2:
                stages -= 1
            else:
                BK //= 2
    return BM, BN, BK, warps, stages


_PROPS: dict = {}  # device index -> Triton's device properties


def _cuda_index(device: torch.device) -> int:
    """The index of CUDA ``device`` (the current device where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _props(device: torch.device) -> dict:
    """Triton's properties of CUDA ``device`` (``max_shared_mem``, ``multiprocessor_count``, ...),
    read once per device."""
    idx = _cuda_index(device)
    if idx not in _PROPS:
        _PROPS[idx] = triton.runtime.driver.active.utils.get_device_properties(idx)
    return _PROPS[idx]


def _smem_limit(device: torch.device) -> Optional[int]:
    """Shared memory per block of ``device`` in bytes (None off the GPU)."""
    return int(_props(device)["max_shared_mem"]) if device.type == "cuda" else None


def _on(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it ``t``'s (a no-op off the GPU)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out: Optional[torch.Tensor] = None,
    rms: bool = False,
    eps: float = 1e-6,
    swiglu: bool = False,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    rows: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    config: Optional[tuple] = None,
) -> torch.Tensor:
    """``x [M, K]`` (rows strided, elements contiguous) times ``w [N_w, K]`` (contiguous).

    * ``rms``: RMSNorm of each x row (over K) first (Qwen3 ``RMSNorm``), its weight already
      folded into ``w`` (:func:`fold_norm`);
    * ``rows [M]``: gather: row ``m`` of the input is ``x[rows[m]]`` (an embedding lookup);
    * ``swiglu``: ``w`` is gate rows then up rows (``N_w = 2N``); the output is ``silu(gate) * up``;
    * ``bias [N]``, ``residual [M, N]`` (added last).

    Returns ``out [M, N]`` (allocated when not given; ``out_dtype`` defaults to w's dtype).
    ``config``: (BM, BN, BK, num_warps, num_stages[, K parts]) instead of
    :func:`launch_config`'s (for tuning; one K part where not given)."""
    assert x.stride(-1) == 1 and w.is_contiguous() and x.shape[-1] == w.shape[1]
    K = w.shape[1]
    M = rows.shape[0] if rows is not None else x.shape[0]
    N = w.shape[0] // 2 if swiglu else w.shape[0]
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=out_dtype or w.dtype)
    assert out.shape == (M, N) and out.stride(-1) == 1
    if residual is not None:
        assert residual.shape == (M, N) and residual.stride(-1) == 1
    # the operands and epilogue switches both GEMM kernels take (an absent tensor's pointer is
    # w's, never read then)
    args = (
        x,
        rows if rows is not None else w,
        w,
        bias if bias is not None else w,
        residual if residual is not None else w,
        out,
        M,
        N,
        K,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        float(eps),
    )
    flags = dict(
        GATHER=rows is not None, RMS=rms, SWIGLU=swiglu, HAS_BIAS=bias is not None, HAS_RES=residual is not None
    )
    pdl = _pdl(w, M)
    if config is None and M <= GEMV_ROWS:
        BN, BK, warps = gemv_tiles(N, K, swiglu)
        with _on(w):
            _gemv_kernel[(triton.cdiv(N, BN),)](
                *args, **flags, BN=BN, BK=BK, GDC=pdl != "off", num_warps=warps, **_launch_opts(pdl)
            )
        return out
    BM, BN, BK, warps, stages, *parts = config or launch_config(M, N, K, w.device, w.element_size(), swiglu)
    split = parts[0] if parts else 1
    grid_nm = triton.cdiv(N, BN) * triton.cdiv(M, BM)
    k_tiles = triton.cdiv(K, BK)
    per = triton.cdiv(k_tiles, split)
    split = triton.cdiv(k_tiles, per)  # no empty parts
    if split > 1:
        ws, locks = _split_buffers(w.device, grid_nm * split * (BM * BN * (2 if swiglu else 1) + BM), grid_nm)
    else:
        ws = locks = w  # never read
    grid = (triton.cdiv(N, BN), triton.cdiv(M, BM), split)
    with _on(w):
        _linear_kernel[grid](
            *args[:6],
            ws,
            locks,
            *args[6:9],
            per * BK,
            *args[9:],
            **flags,
            UPCAST=_INTERPRET,
            IEEE=w.dtype == torch.float32,
            BM=BM,
            BN=BN,
            BK=BK,
            SPLIT=split,
            GDC=pdl != "off",
            PREFETCH=pdl == "prefetch",
            LINE=128 // w.element_size(),
            num_warps=warps,
            num_stages=stages,
            **_launch_opts(pdl),
        )
    return out


# split-K of the tiled kernel: K cut into parts (programs of their own) until the launch has
# about this many programs per multiprocessor; 0: never. Set before CUDA-graph capture.
# 1: on the H200 (run 38a, cold weights) 2 parts took the code predictor's o_proj, down and head
# at 64 rows (64 output tiles) from 6.5/7.6/6.6 to 5.4/6.6/6.4 us, and 4 parts its o_proj and
# down at 8 rows (32 tiles) from 6.9/9.0 to 5.2/6.0; launches of 96-128 tiles (q/k/v, gate/up)
# were slower split (7.0 -> 8.6 us); the frame step at 4-8 rows 5.79-5.87 -> 5.29-5.37 ms, at 64
# 5.81 -> 5.67 (2: 6.52)
SPLIT_K_TARGET = 1
SPLIT_K_MIN_TILES = 2  # K tiles per part at least

_SPLIT_BUFS: dict = {}  # device index -> (fp32 workspace, int32 tile counters)
_SPLIT_OLD: list = []  # replaced buffers: CUDA graphs captured with them still use them


def launch_config(M: int, N: int, K: int, device: torch.device, elt: int = 2, swiglu: bool = False) -> tuple:
    """(BM, BN, BK, num_warps, num_stages, K parts) of :func:`linear`'s tiled kernel for an
    ``M x N x K`` problem of ``elt``-byte elements on ``device``: :func:`tiles` for the GPU's
    shared memory, then :func:`k_splits` for its multiprocessors."""
    BM, BN, BK, warps, stages = tiles(M, N, K, elt, swiglu, _smem_limit(device))
    split = k_splits(-(-N // BN) * -(-M // BM), K, BK, _sm_count(device))
    return BM, BN, BK, warps, stages, split


def k_splits(programs: int, K: int, BK: int, sms: int) -> int:
    """The K parts of a tiled launch of ``programs`` (output tiles) over ``K`` in ``BK`` tiles on
    ``sms`` multiprocessors: doubled while the programs stay within :data:`SPLIT_K_TARGET` per
    multiprocessor and each part keeps :data:`SPLIT_K_MIN_TILES` K tiles. A decode GEMM's few
    output tiles (64 for the code predictor's o_proj and down at 64 rows on 132
    multiprocessors) leave multiprocessors idle and too few weight loads in flight."""
    split = 1
    while (
        SPLIT_K_TARGET > 0
        and programs * split * 2 <= SPLIT_K_TARGET * sms
        and -(-K // BK) // (split * 2) >= SPLIT_K_MIN_TILES
    ):
        split *= 2
    return split


def _split_buffers(device: torch.device, floats: int, tiles: int) -> tuple:
    """The split-K workspace (at least ``floats`` fp32) and tile counters (at least ``tiles``,
    zero between launches: each launch's last program of a tile resets its counter) of
    ``device``, shared by every launch there (the engine's launches run one after another on one
    stream). Grown outside CUDA-graph capture only: a warm-up launch before the capture
    allocates them (a zeroing captured in one graph would not run before the others)."""
    idx = _cuda_index(device) if device.type == "cuda" else device.index
    ws, locks = _SPLIT_BUFS.get((device.type, idx), (None, None))
    if ws is None or ws.numel() < floats or locks.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the split-K workspace grows only outside CUDA-graph capture: warm up first")
        if ws is not None:
            _SPLIT_OLD.append((ws, locks))
            floats, tiles = max(floats, ws.numel()), max(tiles, locks.numel())
        ws = torch.empty(floats, device=device, dtype=torch.float32)
        locks = torch.zeros(max(tiles, 1024), device=device, dtype=torch.int32)
        _SPLIT_BUFS[(device.type, idx)] = (ws, locks)
    return ws, locks


GEMV_ELEMENTS = 8192  # weight elements one program of _gemv_kernel loads (BN whole rows)


def gemv_tiles(N: int, K: int, swiglu: bool = False) -> tuple:
    """(BN, BK, num_warps) of :func:`_gemv_kernel`: ``BK`` is K's power of two, ``BN`` the rows
    that make about :data:`GEMV_ELEMENTS` weight elements per program (half with SwiGLU, which
    loads a gate and an up row each), at least one; 4 warps."""
    BK = 1 << (K - 1).bit_length()
    BN = max(1, (GEMV_ELEMENTS // (2 if swiglu else 1)) // BK)
    return BN, BK, 4


# warps per (row, kv head) program of the code predictor's attention: 4, and 2 from this many
# rows (run 41d, H200: 2 warps took the 64-row frame step 5.48 -> 5.40 ms and were no faster at
# 1-32 rows; 8 warps were slower everywhere)
CP_ATTN_WARPS = 4
CP_ATTN_FEW_WARPS_ROWS = 64


def cp_attention(
    qkv: torch.Tensor,
    qk_w: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    p0: int,
    T: int,
    heads: int,
    kv_heads: int,
    eps: float,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Attention of one code-predictor layer for ``B`` rows of ``T`` new positions ``p0..p0+T-1``.

    ``qkv [B*T, (H + 2 KV) * hd]`` (the fused projection, rows b-major); ``qk_w [H + KV, hd]``
    (q_norm per q head, then k_norm per kv head); ``cos``/``sin [P, hd]`` (sign-folded sin);
    ``k_cache``/``v_cache [B', KV, P, hd]`` (this layer's slots, B' >= B, hd contiguous): the new
    rows are written at ``p0..p0+T-1``. Returns ``o [B*T, H * hd]`` (causal over ``0..p0+t``)."""
    BT = qkv.shape[0]
    B = BT // T
    P, hd = cos.shape
    assert BT == B * T and heads % kv_heads == 0 and p0 + T <= P and k_cache.shape[2] == P
    assert all(n & (n - 1) == 0 for n in (P, hd, T * heads // kv_heads))  # tl.arange sizes
    assert qkv.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    if out is None:
        out = torch.empty(BT, heads * hd, device=qkv.device, dtype=qkv.dtype)
    pdl = _pdl(qkv, B)
    with _on(qkv):
        _cp_attn_kernel[(B, kv_heads)](
            qkv,
            qk_w,
            cos,
            sin,
            k_cache,
            v_cache,
            out,
            int(p0),
            qkv.stride(0),
            out.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            float(eps),
            float(hd) ** -0.5,
            T=T,
            H=heads,
            KVH=kv_heads,
            HD=hd,
            P=P,
            GDC=pdl != "off",
            num_warps=2 if B >= CP_ATTN_FEW_WARPS_ROWS else CP_ATTN_WARPS,
            **_launch_opts(pdl),
        )
    return out


def rope_kv_write(
    qkv: torch.Tensor,
    qk_w: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    kv_heads: int,
    eps: float,
) -> torch.Tensor:
    """The talker's decode step between its q/k/v GEMM and attention, in one kernel: q/k
    RMSNorm, RoPE at each row's position ``pos [B]`` (tables ``cos``/``sin [M, hd]``,
    sign-folded sin), keys and values written into ``k_cache``/``v_cache [B', KV, M, hd]`` at
    ``pos``. ``qkv [B, (H + 2 KV) * hd]``; returns the queries ``[B, H * hd]``."""
    B = qkv.shape[0]
    hd = cos.shape[1]
    assert qkv.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    q = torch.empty(B, heads * hd, device=qkv.device, dtype=qkv.dtype)
    pdl = _pdl(qkv, B)
    with _on(qkv):
        _rope_kv_kernel[(B, heads + kv_heads)](
            qkv,
            qk_w,
            cos,
            sin,
            pos,
            k_cache,
            v_cache,
            q,
            qkv.stride(0),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            float(eps),
            H=heads,
            KVH=kv_heads,
            HD=hd,
            GDC=pdl != "off",
            num_warps=1,
            **_launch_opts(pdl),
        )
    return q


DECODE_QB = 16  # the query tile's rows (a kv group's query heads, zero-padded): the dots' minimum
DECODE_MIN_CHUNK = 128  # cached positions per split at least


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (132 off the GPU: the H100's, so that the
    interpreter's tests split as a GPU would)."""
    return int(_props(device)["multiprocessor_count"]) if device.type == "cuda" else 132


def decode_config(B: int, kv_heads: int, C: int, sms: int) -> tuple:
    """(positions per block, num_warps, num_stages, splits) of :func:`decode_attention` for ``B``
    rows of a context bucket ``C`` on ``sms`` multiprocessors: the fastest of run 41a's sweep
    (``scripts/kernel_sweep.py --attention``, the 1.7B talker's 8 kv heads, cold caches, H200).

    With at least one (row, kv head) program per multiprocessor the context is not split (no
    combine kernel, no partial sums written and read back: 64 rows of 300 positions 26.2 -> 23.2
    us, 128 rows 47.3 -> 41.9), blocks of 64 positions, 3 pipeline stages up to two programs per
    multiprocessor and 2 above. With fewer, the context is cut into splits of at least
    :data:`DECODE_MIN_CHUNK` positions for about two programs per multiprocessor (one row of
    1,024 positions: 8 splits, 5.0 us; of 128: one, 3.0 us), blocks of 128 positions where a
    split is at most 128 long, else 64 with 3 stages."""
    programs = max(1, B * kv_heads)
    if programs >= sms:
        return 64, 4, (3 if programs < 2 * sms else 2), 1
    splits = max(1, min(-(-2 * sms // programs), C // DECODE_MIN_CHUNK))
    if -(-C // splits) <= 128:
        return 128, 4, 2, splits
    return 64, 4, 3, splits


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: torch.Tensor,
    C: int,
    heads: int,
    kv_heads: int,
    splits: Optional[int] = None,
    config: Optional[tuple] = None,
) -> torch.Tensor:
    """The talker's one-row decode attention (flash-decoding): ``q [B, H * hd]`` (head-major, the
    query heads of kv group g at ``g * H / KV ..``) over ``k_cache``/``v_cache [B', KV, M, hd]``
    (this layer's slots, B' >= B) at positions ``0 .. pos[b]`` of each row (``pos [B]`` on the
    device, so a CUDA graph replays it for any positions below its bucket ``C``). Reads only the
    cached positions, not the whole bucket as SDPA with a mask does. The context is cut into
    ``splits`` parts (default :func:`decode_config`'s) run in parallel and merged by a second
    kernel. Returns ``o [B, H * hd]`` in q's dtype, the layout of :func:`_decode_sdpa`'s output
    reshaped to rows. ``config``: (positions per block, num_warps, num_stages, splits) instead of
    :func:`decode_config`'s (for tuning: ``scripts/kernel_sweep.py --attention``)."""
    B = q.shape[0]
    hd = k_cache.shape[-1]
    assert q.is_contiguous() and q.shape[1] == heads * hd and heads % kv_heads == 0
    assert k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and C <= k_cache.shape[2]
    assert hd & (hd - 1) == 0
    block, warps, stages, S = config or decode_config(B, kv_heads, C, _sm_count(q.device))
    if splits:  # blocks no longer than a split (at least 32 positions)
        S = splits
        block = min(block, max(32, 1 << (-(-C // S) - 1).bit_length()))
    chunk = -(-C // S)  # positions per split: ceil(C / S), in whole blocks
    chunk = -(-chunk // block) * block
    rep = heads // kv_heads
    RP = 1 << (rep - 1).bit_length()
    o = torch.empty(B, heads * hd, device=q.device, dtype=q.dtype)
    part = torch.empty(B * kv_heads * S * RP * (hd + 2) if S > 1 else 1, device=q.device, dtype=torch.float32)
    pdl = _pdl(q, B)
    with _on(q):
        _decode_attn_kernel[(B, kv_heads, S)](
            q,
            k_cache,
            v_cache,
            pos,
            part,
            o,
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            float(hd) ** -0.5,
            chunk,
            H=heads,
            KVH=kv_heads,
            HD=hd,
            RP=RP,
            QB=max(DECODE_QB, RP),
            BLOCK=block,
            SPLITS=S,
            UPCAST=_INTERPRET,
            IEEE=q.dtype == torch.float32,
            GDC=pdl != "off",
            num_warps=warps,
            num_stages=stages,
            **_launch_opts(pdl),
        )
        if S > 1:
            _decode_combine_kernel[(B, kv_heads)](
                part,
                o,
                H=heads,
                KVH=kv_heads,
                HD=hd,
                RP=RP,
                SPLITS=S,
                GDC=pdl != "off",
                num_warps=4,
                **_launch_opts(pdl),
            )
    return o
