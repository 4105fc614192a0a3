"""Settings of the native engine (:class:`NativeEngineConfig`), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from triton_qwen3_tts.engines.base import EngineError
from triton_qwen3_tts.engines.native.options import KERNELS, PDL_MODES

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _doublings(start: int, below: int) -> Tuple[int, ...]:
    """``start, 2 * start, 4 * start, ...`` while less than ``below`` (the engine's buckets)."""
    out = []
    while start < below:
        out.append(start)
        start *= 2
    return tuple(out)


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
    * ``kernels``: ``"torch"`` (the decode step's layers as the blocks above) or ``"triton"``
      (:mod:`triton_qwen3_tts.engines.native.kernels`: the code predictor's layers as five
      fused Triton kernels each, the talker's as five plus SDPA; its own rounding; CUDA, or
      Triton's interpreter for tests). Prefill: ``prefill_kernel_rows``; the kernels' arithmetic
      is the fast one (SDPA, norms with the weight) whatever ``fast_math`` says.
    * ``prefill_kernel_rows``: with ``kernels="triton"``, a prefill of at most this many padded
      rows (prompts x length bucket) runs the talker layers' GEMMs on the Triton kernels (the
      norms folded in, residual and SwiGLU epilogues: four kernels where the torch blocks launch
      about ten, per layer); q/k norm, RoPE, the KV writes and causal SDPA stay torch ops. Larger
      prefills keep the torch blocks (the kernels' tiles are chosen for skinny GEMMs and re-read
      the weights once per 64 rows). Default 64: on the H200 (run 40b, docs/benchmark-history.md)
      every captured prefill of at most 64 padded rows was faster on the kernels (one prompt of
      32 rows 2.44 against 2.83 ms, two 2.53 against 2.90) and every larger one slower (8 x 16
      rows 3.65 against 3.18); 0: always the torch blocks.
    * ``pdl``: with ``kernels="triton"`` on Hopper or newer, programmatic dependent launch of
      the kernels (:func:`kernels.set_pdl`, process-wide, set when the model loads): ``"few"``
      (default) for the launches of at most ``kernels.GEMV_ROWS`` rows, ``"on"``, ``"prefetch"``
      or ``"off"``; the arithmetic is the same in every mode (run 37, docs/benchmark-history.md).
    * ``split_k``: with ``kernels="triton"``, the tiled GEMM kernel cuts K into parts while a
      launch has fewer programs than this many per multiprocessor (:data:`kernels.SPLIT_K_TARGET`,
      process-wide, set when the model loads; 0: never). The parts' fp32 sums are added in a
      fixed order, so the results do not depend on which program finishes last.
    * ``batched_prefill``: the requests admitted in one scheduler round are prefilled together,
      right-padded to one length, in groups of at most ``prefill_max_tokens`` padded rows
      (False: one prefill per request, for A/B timing).
    * ``prefill_graphs``: None -> as ``cuda_graphs``: capture the prefill per (prompt-count
      bucket, length bucket) with ``P * L <= prefill_max_tokens`` (``prefill_batch_sizes``,
      ``prefill_len_sizes``); other shapes run eagerly.
    * ``overlap_steps``: the loop launches each decode step before it reads the previous step's
      frames (copied to pinned host memory behind the step), so the host's work between steps
      (frames to the streams, releases, admissions) runs while the GPU computes the next one. A row
      whose EOS is read only then has run one extra step, whose frame is dropped. False reads each
      step before the next (for A/B timing).
    * ``deep_overlap_rows``: with ``overlap_steps``, from this many active rows the loop keeps two
      launched steps unread, not one: it reads step ``k - 2`` after launching step ``k``, so the
      GPU has two steps queued while the host works, and an iteration whose host work outlasts one
      step (an admission, a co-worker's launch) does not leave it idle. Each frame is read one step
      later, a row whose EOS is read then has run two extra steps, and ``unread_rows`` (exactly
      one unread step) is empty while two are. 0: always one.
    * ``admit_after_step``: with ``overlap_steps``, while requests are decoding, the loop
      launches their decode step before it admits new requests (their slot rows and prefill), so
      the admission's host work runs while the GPU has that step queued instead of while it may
      run dry; the new requests join the next step (their first frame one step later). An idle
      engine admits first either way.
    * ``admit_after_codec``: with a co-worker (the fused pipeline's codec), while requests are
      decoding, the loop launches the co-worker's codec call (when it makes one) before it
      admits new requests, so the GPU has that call queued behind the running step while the
      loop does the admission's host work; the new requests still join this iteration's step,
      their prefill behind the codec call. An idle engine admits first either way.
    * ``admit_hold_ms``: while requests are decoding, new requests wait up to this long (from
      when they entered the queue) to be admitted together, or until ``admit_hold_requests`` of
      them (or as many as there are free slots) wait: each admission costs a prefill launch, a
      first-chunk codec call and host work the GPU may wait for, whatever the number of prompts
      it takes, so fewer, larger admissions give more audio per GPU-second at up to this much
      more time to first audio. An idle engine admits at once. 0: admit every iteration.
    * ``admit_hold_min_rows``: the hold applies only while at least this many rows decode: a
      saturated GPU gains from fewer admissions, a lightly loaded one would only add the wait
      to the time to first audio.
    * ``loop_thread``: the scheduler loop runs on a thread of its own and hands each iteration's
      frames to the event loop without waiting for it, so the event loop's work runs while the
      loop waits for the GPU (engine module docstring); False: an asyncio task runs each
      iteration in the default executor and hands its frames over between iterations.
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
    kernels: str = "torch"
    prefill_kernel_rows: int = 64
    pdl: str = "few"
    split_k: int = 1
    batched_prefill: bool = True
    prefill_max_tokens: int = 4096
    prefill_graphs: Optional[bool] = None
    overlap_steps: bool = True
    deep_overlap_rows: int = 0
    admit_after_step: bool = False
    admit_after_codec: bool = False
    admit_hold_ms: float = 0.0
    admit_hold_requests: int = 8
    admit_hold_min_rows: int = 1
    loop_thread: bool = True

    def __post_init__(self):
        def bad(f, msg):
            raise EngineError(f"NativeEngineConfig.{f}: {msg}")

        for f in (
            "max_num_seqs",
            "max_model_len",
            "max_trailing_tokens",
            "max_top_k",
            "prefill_max_tokens",
            "admit_hold_requests",
            "admit_hold_min_rows",
        ):
            if not _pos_int(getattr(self, f)):
                bad(f, f"must be a positive int, got {getattr(self, f)!r}")
        for f in ("prefill_kernel_rows", "deep_overlap_rows"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                bad(f, f"must be an int >= 0, got {v!r}")
        v = self.admit_hold_ms
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1000:
            bad("admit_hold_ms", f"must be a number of milliseconds in [0, 1000], got {v!r}")
        v = self.split_k
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 16:
            bad("split_k", f"must be an int in [0, 16], got {v!r}")
        if self.max_model_len < 3:
            bad("max_model_len", "must be >= 3 (prompt + at least one frame)")
        if not isinstance(self.device, str) or not (
            self.device == "cpu"
            or self.device == "cuda"
            or (self.device.startswith("cuda:") and self.device[5:].isdigit())
        ):
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
        if self.kernels not in KERNELS:
            bad("kernels", f"{self.kernels!r}; allowed: {', '.join(KERNELS)}")
        if self.pdl not in PDL_MODES:
            bad("pdl", f"{self.pdl!r}; allowed: {', '.join(PDL_MODES)}")
        if self.prefill_graphs is not None and not isinstance(self.prefill_graphs, bool):
            bad("prefill_graphs", f"must be a bool or None, got {self.prefill_graphs!r}")
        for f in (
            "fuse_weights",
            "skip_top_p",
            "compile",
            "batched_prefill",
            "overlap_steps",
            "admit_after_step",
            "admit_after_codec",
            "loop_thread",
        ):
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
        return _doublings(16, min(self.max_model_len, self.prefill_max_tokens) + 1)

    def prefill_batch_sizes(self) -> Tuple[int, ...]:
        """Prompt-count buckets of the captured prefills: powers of two up to ``max_num_seqs``,
        plus it. Finer than the decode buckets because a prefill's cost grows with its padded
        rows (run 40b: 4 prompts of 64 rows 3.63 ms, padded to 8 prompts 5.25)."""
        return _doublings(1, self.max_num_seqs) + (self.max_num_seqs,)

    def prefill_buckets(self) -> Tuple[Tuple[int, int], ...]:
        """The captured prefills' ``(prompts, length)`` buckets: ``P * L <= prefill_max_tokens``."""
        return tuple(
            (p, L)
            for L in self.prefill_len_sizes()
            for p in self.prefill_batch_sizes()
            if p * L <= self.prefill_max_tokens
        )

    @property
    def use_fast_math(self) -> bool:
        return self.device.startswith("cuda") if self.fast_math is None else self.fast_math

    def batch_sizes(self) -> Tuple[int, ...]:
        """Effective decode buckets: configured ones <= max_num_seqs, plus max_num_seqs."""
        return tuple(sorted({b for b in self.batch_buckets if b <= self.max_num_seqs} | {self.max_num_seqs}))

    def ctx_sizes(self) -> Tuple[int, ...]:
        """Effective attention context buckets (ascending; the last is max_model_len)."""
        if self.ctx_buckets is None:
            out = set(_doublings(256, self.max_model_len))
        else:
            out = {c for c in self.ctx_buckets if c < self.max_model_len}
        return tuple(sorted(out | {self.max_model_len}))
