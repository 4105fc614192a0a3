"""NativeEngine: the Qwen3-TTS talker + code predictor in plain PyTorch, continuous batching at
frame granularity, one CUDA graph per (batch bucket, context bucket, top-p variant), batched
prefill captured per (batch bucket, length bucket) (design: docs/design/native-engine.md).

Same request type and async interface as the vLLM :class:`~triton_qwen3_tts.engines.vllm.engine.TalkerEngine`::

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

**Co-worker.** A caller may put other GPU work into the same loop (the fused pipeline's codec,
``serving/talker/fused.py``): an object set as ``engine.cowork`` before requests arrive, with

* ``run(talker_busy) -> bool`` (worker thread, each iteration, after releases and
  admissions): do some work instead of this iteration's decode step and return True, or False;
* ``finish()`` (optional; worker thread, after each ``run`` that returned True): ``run`` only
  launched its GPU work, ``finish`` waits for it and hands its results out. With
  ``overlap_steps`` the loop launches a decode step between the two, so the GPU has the step
  queued behind that work while the host waits for it and then does the rest of the iteration;
* ``on_events(events)`` (worker thread, end of each iteration): ``(request_id, frames [1, 16] or
  None, finished)`` of every request the iteration touched;
* ``has_work() -> bool`` (where the loop runs, when it has no request of its own): whether it
  must keep turning for the co-worker's worker-thread work;
* ``dispatch()`` (event loop, after each iteration): a chance to hand its results to its
  consumers;
* ``on_stop(error)`` (optional; event loop, once the loop has stopped: failed, cancelled or shut
  down): end every stream of its own that still waits for the loop with an ``error()`` of its
  own (the fused pipeline: streams whose talker request is done but whose audio is not all out);
* ``read_first(request_ids) -> bool`` (optional; worker thread, before ``run``, while a launched
  step is unread): True to have the loop read the steps in flight first, and hand their frames to
  ``on_events``, because those frames complete work that should not queue behind another step
  (the fused pipeline: a stream's first chunk). ``request_ids``: the requests with rows in them;
* ``unread_rows()`` (engine method, for ``run``): the rows of the launched, unread step, whose
  frames a co-worker may read on the device (``model.out``) before the next step is launched;
* ``frames_to_cowork`` (optional, default False): True when ``on_events`` is where the frames
  go. ``synthesize`` then yields none (it ends with its request, or raises its error), and the
  loop spares every stream a queue hand-over and a coroutine switch per step (at 64 streams most
  of the loop's own time on the host).

**Where the loop runs.** With ``loop_thread`` (the default) the scheduler loop has a thread of
its own: it takes admissions from the waiting queue, runs one iteration after the other and hands
each iteration's events to the event loop (``call_soon_threadsafe``), which puts them into the
streams' queues while the thread is already on its next iteration. The event loop's work (the
hand-over, the streams' consumers, new requests) then runs while the thread waits for the GPU,
instead of between two iterations: with the overlap the GPU has one step queued, and every
millisecond of host work beyond that step's time leaves it idle; from ``deep_overlap_rows``
active rows it has two. Without ``loop_thread`` an asyncio task runs each iteration in the
default executor and does the hand-over itself between iterations. Either way one iteration runs at a time. The loop thread lowers the interpreter's
GIL switch interval to ``SWITCH_INTERVAL_S`` (process-wide), so that it does not wait 5 ms for the
event loop's turn before launching a step. With the thread, the co-worker's
``has_work`` runs on the loop thread and its ``dispatch`` on the event loop, at the same time as
the worker-thread parts: they may only touch what is safe to share (deques: appends and pops).
``wake()`` makes an idle loop look again.

Imports neither vLLM nor Triton.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from triton_qwen3_tts.engines.base import (
    EngineError,
    TalkerRequest,
    check_prompt_frames_trailing,
    check_sampling_fields,
)

from triton_qwen3_tts.engines.native.admission import hold_admission
from triton_qwen3_tts.engines.native.config import NativeEngineConfig
from triton_qwen3_tts.engines.native.model import NativeModel
from triton_qwen3_tts.engines.native.graphs import _Graphs
from triton_qwen3_tts.engines.native.gputime import GpuTimer, HostEvent, LoopClock
from triton_qwen3_tts.engines.rng import gumbel_noise, hash_seed

__all__ = [
    "NativeEngineConfig",
    "NativeEngine",
    "NativeModel",
    "EngineError",
    "TalkerRequest",
    "gumbel_noise",
    "hash_seed",
]


@dataclass(eq=False)
class _Req:
    req: TalkerRequest
    prompt: torch.Tensor
    trailing: torch.Tensor
    key: int
    queue: asyncio.Queue
    slot: int = -1
    pos: int = 0  # host mirror of the next talker position, counting every launched step
    frames: int = 0  # frames read back
    launched: int = 0  # decode steps launched with this request's row
    stopped: bool = False  # its last frame was read (or it was aborted): later rows of it are void
    done: bool = False
    aborted: bool = False
    freed: Optional[asyncio.Event] = None
    t_submit: float = field(default_factory=time.perf_counter)

    @property
    def uses_top_p(self) -> bool:
        """Whether a draw of this request (codebook 0 or a residual) needs the top-p filter."""
        r = self.req
        sub_greedy = r.greedy if r.sub_greedy is None else r.sub_greedy
        return (not r.greedy and r.top_p < 1.0) or (not sub_greedy and r.sub_top_p < 1.0)


_END = object()
log = logging.getLogger(__name__)


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


# the interpreter's GIL switch interval with ``loop_thread`` (seconds; ``_scheduler_thread``)
SWITCH_INTERVAL_S = 0.0005


@dataclass(eq=False)
class _Launched:
    """A decode step on the GPU whose frames are not read yet: ``rows[i]`` is the request of
    output row ``i``; ``host`` receives ``out[:n]`` behind the step, ``ready`` marks the copy done
    (a timing event of the engine's ``gpu_time``; on the CPU, where the copy is synchronous, a
    host-clock one)."""

    rows: List[_Req]
    host: torch.Tensor
    ready: Optional[object]


def _h2d(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy host tensor ``src`` into ``dst`` without making the host wait for the GPU: on CUDA
    from pinned memory, ordered on the stream behind the work already launched (a pageable copy
    waits for the whole stream, a launched decode step included). torch's host allocator keeps
    the pinned block until the copy is done."""
    if dst.is_cuda:
        dst.copy_(src.to(dst.dtype).pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def _eos_masked_at_prefill(req: TalkerRequest) -> bool:
    """The prefill's first codebook-0 token cannot be EOS: ``NativeModel.process_c0`` masks it
    while fewer than ``min_new_tokens`` tokens were sampled (none at the prefill) or with
    ``suppress_eos``."""
    return bool(req.suppress_eos) or int(req.min_new_tokens) >= 1


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
        # loop_thread: the loop thread sleeps on this when idle; the lock makes abort's check of
        # the waiting queue and its removal one step against the thread's admissions
        self._twake = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the event loop start() ran on
        self._wlock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._error: Optional[BaseException] = None
        self._rng = random.Random(config.seed)
        self.steps = 0
        self.step_hist: Dict[Tuple[int, int], int] = {}
        self.prefill_hist: Dict[Tuple[int, int, bool], int] = {}  # (P, L, graph) -> calls
        self.pf_graphs = False  # prefill graphs captured (keys ("prefill", P, L) in graphs)
        self._inflight: deque = deque()  # _Launched steps, oldest first (at most three)
        self._host_out: List[torch.Tensor] = []  # three host buffers for out, used in turn
        self._stage: Dict[torch.dtype, torch.Tensor] = {}  # _h2d_rows' device staging, per dtype
        self.cowork = None  # optional: other work in this loop (module docstring)
        # device time per kind of launch (steps per batch bucket, prefills; the co-worker adds
        # its own): CUDA timing events on a GPU, the host clock on the CPU, from the load on
        self.gpu_time = GpuTimer(False)
        self.loop_time = LoopClock()  # host wall time of the loop's phases (stats()["loop_ms"])

    @classmethod
    async def create(
        cls, checkpoint_dir, config: NativeEngineConfig = NativeEngineConfig(), talker=None
    ) -> "NativeEngine":
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
            from triton_qwen3_tts.model.checkpoint import load_checkpoint

            ck = load_checkpoint(
                self.checkpoint_dir,
                device=c.device,
                dtype=c.torch_dtype,
                load_speech_tokenizer=False,
                load_tokenizer=False,
            )
            talker = ck.model.talker
            tts_pad_id = ck.config.tts_pad_token_id
            ck.model.speaker_encoder = None
        else:
            talker = talker.to(device=c.device, dtype=c.torch_dtype)
        if tts_pad_id is None:
            if self.checkpoint_dir is not None:
                from triton_qwen3_tts.model.checkpoint import load_talker_config

                tts_pad_id = load_talker_config(self.checkpoint_dir).tts_pad_token_id
            else:
                tts_pad_id = 151671
        talker.eval()
        for p in talker.parameters():
            p.requires_grad_(False)
        self.model = NativeModel(talker, c, tts_pad_id)
        pin = self.model.out.is_cuda
        self.gpu_time = GpuTimer(True, event=None if pin else HostEvent)
        self._host_out = [
            torch.empty(self.model.out.shape, dtype=self.model.out.dtype, pin_memory=pin) for _ in range(3)
        ]
        if c.use_graphs:
            self.graphs = _Graphs(self.model)
            tps = (False, True) if c.skip_top_p else (True,)
            keys = [(b, cc, tp) for b in c.batch_sizes() for cc in c.ctx_sizes() for tp in tps]
            self.capture_seconds = self.graphs.capture(self.model.step, keys, order=lambda k: (-k[0], -k[1], k[2]))
            if c.use_prefill_graphs:
                m = self.model
                keys = [("prefill", p, L) for p, L in c.prefill_buckets()]
                m.pf_x.zero_()
                m.pf_slots.fill_(m.SCR)  # warm-up and capture write the scratch slot only
                m.pf_last.zero_()
                self.capture_seconds += self.graphs.capture(
                    lambda _, p, L: m.prefill_rows(p, L), keys, order=lambda k: (-k[1] * k[2], -k[1])
                )
                self.pf_graphs = True

    async def start(self) -> None:
        if self._task is not None:
            return
        if self.model is None:
            await asyncio.get_running_loop().run_in_executor(None, self._load)
        self._wake = asyncio.Event()
        body = self._scheduler_thread() if self.config.loop_thread else self._scheduler()
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(body)

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
        # temperatures, top-k (at most max_top_k: sampling is among the top max_top_k ids), top-p
        check_sampling_fields(req, self.model.V, self.model.cpV, c.max_top_k)
        if not isinstance(req.min_new_tokens, int) or req.min_new_tokens < 0:
            raise EngineError(f"min_new_tokens must be an int >= 0, got {req.min_new_tokens!r}", field="min_new_tokens")
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
        self.wake()
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
        with self._wlock:  # the loop thread takes admissions from the deque under the lock
            waiting = r in self._waiting
            if waiting:  # not handed to the scheduler yet
                self._waiting.remove(r)
        if waiting:
            self._finish(r)
            return
        if r.freed is None:
            r.freed = asyncio.Event()
        self.wake()
        if self._task is not None and not self._task.done():
            await r.freed.wait()

    def wake(self) -> None:
        """Make an idle scheduler look for work again (the co-worker has some). Event loop
        thread only (``asyncio.Event`` is not thread-safe)."""
        if self._wake is not None:
            self._wake.set()
        self._twake.set()

    def stats(self) -> dict:
        return {
            "active": len(self._active),
            "free": self.config.max_num_seqs - len(self._active),
            "waiting": len(self._waiting),
            "tracked": len(self._by_id),
            "steps": self.steps,
            "gpu_ms": self.gpu_time.snapshot(),
            "gpu_gap_ms": self.gpu_time.gap_snapshot(),
            "loop_ms": self.loop_time.snapshot(),
        }

    def shutdown(self) -> None:
        """Stop the loop; every request still open ends with an error. Callable from any thread
        (a Triton model's ``finalize`` runs on one of Triton's while the engine's event loop runs
        on its own): the asyncio part then runs on the engine's event loop, as asyncio wants."""
        self._closed = True
        self._twake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)  # it stops after its iteration in progress
        loop = self._loop
        if loop is not None and loop.is_running() and not _running_on(loop):
            done = threading.Event()

            def stop() -> None:
                try:
                    self._stop_task()
                finally:
                    done.set()

            try:
                loop.call_soon_threadsafe(stop)
            except RuntimeError:  # the event loop closed meanwhile: nothing runs there any more
                pass
            else:
                if done.wait(timeout=10):
                    return
                log.warning("native engine: its event loop did not take the shutdown within 10 s")
        self._stop_task()

    def _stop_task(self) -> None:
        """Event loop (or no loop running): cancel the loop's task, end the open requests."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._end_open(lambda: EngineError("engine shut down"))
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
        ``prefill_max_tokens``). Returns, per request, whether its first c0 is already EOS: one
        host read for the whole admission, and none when no request can end there (EOS is masked
        in the prefill's sampling for ``min_new_tokens >= 1`` or ``suppress_eos``, the default
        requests' case), so the GPU's prefill overlaps the loop's next host work."""
        m = self.model
        lap = self.loop_time.lap
        a, P = len(self._active), len(rs)
        pin = m.pos.is_cuda  # host tensors for the GPU are made pinned, not copied there after
        m.reset_rows(a, a + P)
        cols: Dict[torch.Tensor, list] = {
            t: []
            for t in (
                m.n_trailing,
                m.key,
                m.greedy,
                m.sub_greedy,
                m.suppress_eos,
                m.min_new,
                m.temp,
                m.top_k,
                m.top_p,
                m.rep,
                m.sub_temp,
                m.sub_top_k,
                m.sub_top_p,
                m.pos,
                m.live,
            )
        }
        for i, r in enumerate(rs):
            req = r.req
            sub_greedy = req.greedy if req.sub_greedy is None else req.sub_greedy
            n_tr = r.trailing.shape[0]
            if n_tr:
                _h2d(m.trailing[a + i, :n_tr], r.trailing)
            L = r.prompt.shape[0]
            for t, v in (
                (m.n_trailing, n_tr),
                (m.key, r.key),
                (m.greedy, bool(req.greedy)),
                (m.sub_greedy, bool(sub_greedy)),
                (m.suppress_eos, bool(req.suppress_eos)),
                (m.min_new, int(req.min_new_tokens)),
                (m.temp, float(req.temperature)),
                (m.top_k, min(int(req.top_k), m.K0)),
                (m.top_p, float(req.top_p)),
                (m.rep, float(req.repetition_penalty)),
                (m.sub_temp, float(req.sub_temperature)),
                (m.sub_top_k, min(int(req.sub_top_k), m.KR)),
                (m.sub_top_p, float(req.sub_top_p)),
                (m.pos, L),
                (m.live, 1),
            ):
                cols[t].append(v)
            r.slot, r.pos = a + i, L
            self._active.append(r)
        self._copy_columns(a, P, cols, pin)
        # the admission's host time in parts (stats()["loop_ms"]): the slots' rows here, each
        # group's prompts and its prefill's launch in _prefill, the rest (the end-of-speech
        # read) in _work's "admit"
        lap("admit_rows")
        i = 0
        for group in self._prefill_groups(rs):
            self._prefill(a + i, group, pin)
            i += len(group)
        if all(_eos_masked_at_prefill(r.req) for r in rs):
            return [False] * P
        return self._first_tokens_eos(a, P)

    def _copy_columns(self, a: int, P: int, cols: Dict[torch.Tensor, list], pin: bool) -> None:
        """Write each per-slot table's values for slots ``a .. a + P - 1``, per dtype in one
        :meth:`_h2d_rows` (three for the 15 tables)."""
        groups: Dict[torch.dtype, List[Tuple[torch.Tensor, list]]] = {}
        for t, v in cols.items():
            groups.setdefault(t.dtype, []).append((t, v))
        for dt, items in groups.items():
            self._h2d_rows([t[a : a + P] for t, _ in items], [v for _, v in items], dt, pin)

    def _h2d_rows(self, dsts: List[torch.Tensor], values: List[list], dtype: torch.dtype, pin: bool) -> None:
        """``dsts[i][:] = values[i]`` for 1-D device tensors of one ``dtype`` and length: one
        host tensor (pinned on a GPU), one copy of it into a staging buffer on their device and
        one multi-tensor copy from there, whatever their number, not a tensor and a copy each.
        Each torch call lets go of the GIL and takes it back, which beside the engine process's
        other Python threads costs far more than the call itself (run 44d)."""
        n, k = len(values), len(values[0])
        host = torch.tensor(values, dtype=dtype, pin_memory=pin)  # [n, k]
        stage = self._stage.get(dtype)
        if stage is None or stage.numel() < n * k:
            stage = torch.empty(max(n * k, 32 * self.config.max_num_seqs), dtype=dtype, device=dsts[0].device)
            self._stage[dtype] = stage
        # contiguous, so the copy from the host is one transfer; on the stream behind the last
        # copies out of the same buffer
        src = stage[: n * k].view(n, k)
        src.copy_(host, non_blocking=pin)
        torch._foreach_copy_(dsts, list(src.unbind(0)))

    def _first_tokens_eos(self, a: int, P: int) -> List[bool]:
        """Whether the prefill's first token of slots ``a .. a + P - 1`` is EOS: a host read,
        which waits for the prefill."""
        m = self.model
        if m.c0.is_cuda:  # the read waits for the prefill: timed as a wait, not as admission work
            ev = torch.cuda.Event()
            ev.record()
            self.loop_time.wait("wait_prefill", ev)
        return [int(c) == m.eos for c in m.c0[a : a + P].cpu()]

    def _pf_key(self, P: int, L: int):
        """The captured prefill bucket ``("prefill", Pb, Lb)`` for P prompts of at most L rows,
        or None (eager)."""
        c = self.config
        if self.graphs is None or not self.pf_graphs:
            return None
        Ls = [b for b in c.prefill_len_sizes() if b >= L]
        Ps = [b for b in c.prefill_batch_sizes() if b >= P]
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

    def _prefill(self, s0: int, group: List[_Req], pin: bool = False) -> None:
        """One batched prefill of ``group`` into slots ``s0, s0 + 1, ...``: a graph replay of its
        (P, L) bucket, or eager at the exact padded size. ``pin``: the host tensors are made in
        pinned memory (a GPU's copies then need no staging copy)."""
        m = self.model
        lap = self.loop_time.lap
        P = len(group)
        Lmax = max(int(r.prompt.shape[0]) for r in group)
        key = self._pf_key(P, Lmax)
        Pb, Lb = (key[1], key[2]) if key is not None else (P, Lmax)
        # the prompts padded in a few torch calls, not two per prompt (see _h2d_rows)
        x = torch.zeros(Pb, Lb, m.D, dtype=m.dtype, pin_memory=pin)
        x[:P, :Lmax].copy_(pad_sequence([r.prompt for r in group], batch_first=True))
        _h2d(m.pf_x[: Pb * Lb * m.D], x.view(-1))
        slots = [s0 + i for i in range(P)] + [m.SCR] * (Pb - P)
        last = [int(r.prompt.shape[0]) - 1 for r in group] + [0] * (Pb - P)
        self._h2d_rows([m.pf_slots[:Pb], m.pf_last[:Pb]], [slots, last], torch.int64, pin)
        lap("admit_prompts")
        t0 = self.gpu_time.start()
        if key is not None:
            self.graphs.replay(key)
        else:
            m.prefill_rows(Pb, Lb)
        self.gpu_time.stop("prefill", t0)
        k = (Pb, Lb, key is not None)
        self.prefill_hist[k] = self.prefill_hist.get(k, 0) + 1
        lap("admit_prefill")

    def _bucket(self, sizes, n):
        for b in sizes:
            if b >= n:
                return b
        raise RuntimeError(f"no bucket for {n}")

    @torch.inference_mode()
    def _launch_step(self) -> None:
        """Launch one decode step of every active slot and the copy of its frames to the host
        behind it; the host does not wait (``_read_step`` does)."""
        c = self.config
        rows = list(self._active)
        n = len(rows)
        B = self._bucket(c.batch_sizes(), n)
        need = max(r.pos for r in rows) + 1
        C = self._bucket(c.ctx_sizes(), need)
        # top-p only when some sampled row asks for it (host-side request params: no device read)
        tp = not c.skip_top_p or any(r.uses_top_p for r in rows)
        t0 = self.gpu_time.start()
        if self.graphs is not None:
            self.graphs.replay((B, C, tp))
        else:
            self.model.step(B, C, tp)
        # at most two launched steps are unread here (deep_overlap_rows): their buffers are the
        # two other ones
        host = self._host_out[self.steps % 3][:n]
        host.copy_(self.model.out[:n], non_blocking=host.is_pinned())
        ready = self.gpu_time.stop(f"step_b{B}", t0)  # the frames' copy is done
        self.steps += 1
        self.step_hist[(B, C)] = self.step_hist.get((B, C), 0) + 1
        for r in rows:
            r.pos += 1
            r.launched += 1
        self._inflight.append(_Launched(rows, host, ready))

    def _read_step(self, st: _Launched) -> List[Tuple[_Req, Optional[np.ndarray], bool]]:
        """Wait for a launched step's frames; ``(request, frames [1, 16], finished)`` per row
        that still counts (rows of stopped requests are dropped)."""
        if st.ready is not None:
            self.loop_time.wait("wait_step", st.ready)
            self.gpu_time.collect()
        out = st.host.numpy().copy()  # the buffer is reused three steps on
        events = []
        for i, r in enumerate(st.rows):
            if r.stopped:
                continue
            r.frames += 1
            row = out[i]
            stop = bool(row[-1]) or r.frames >= r.req.max_frames
            r.stopped = stop
            events.append((r, row[None, :-1], stop))
        return events

    def _work(self, admits: List[_Req]) -> List[Tuple[_Req, Optional[np.ndarray], bool]]:
        """Scheduler body, run off the event loop: releases, admissions, a co-worker call or the
        launch of one decode step, then the frames of the steps read back (with
        ``overlap_steps``, all but the last one launched, or two: ``_unread_kept``). Returns
        ``(request, frames [1, 16] or None, finished)`` events for the loop to dispatch."""
        events = []
        lap = self.loop_time.lap
        lap("between")  # the wake checks and _admissions() (in the executor: also the event loop's turn)
        # releases happen on the stream behind any launched step; a request whose frames are all
        # launched leaves now, its last frame still to be read
        for r in [r for r in self._active if r.aborted or r.launched >= r.req.max_frames]:
            self._release(r)
            if r.aborted:
                r.stopped = True
                events.append((r, None, True))
        lap("release")
        live = []
        for r in admits:
            if r.aborted:
                r.stopped = True
                events.append((r, None, True))
            else:
                live.append(r)
        c = self.config
        # admit_after_step: the running requests' step is launched first and the admission's
        # host work runs while the GPU has it queued; the new requests join the next step. Not
        # where one of them may end at its prefill: that read would wait for the step too
        masked = all(_eos_masked_at_prefill(r.req) for r in live)
        late = bool(live) and c.admit_after_step and c.overlap_steps and bool(self._active) and masked
        cw = self.cowork
        # admit_after_codec: beside running requests, the co-worker's codec call is launched
        # first, so the GPU has it queued behind the running step while the loop builds the
        # admission; the new requests still join this iteration's step. Not where one of them
        # may end at its prefill (that read would wait for the codec call too)
        after_codec = bool(live) and not late and c.admit_after_codec and cw is not None and bool(self._active)
        after_codec = after_codec and masked
        if live and not late and not after_codec:
            self._admit(live, events)
        lap("admit")
        read_first = getattr(cw, "read_first", None)
        if self._inflight and read_first is not None:
            ids = {r.req.request_id for st in self._inflight for r in st.rows if not r.stopped}
            if read_first(ids):
                events.extend(self._read_launched(0))
        if after_codec and not self._active:  # that read released every running row: idle, admit first
            self._admit(live, events)
            after_codec = False
        told = len(events)
        self._tell(events)
        lap("read_first_tell")
        ran = cw is not None and cw.run(bool(self._active))
        lap("cowork_launch")
        if after_codec:
            self._admit(live, events)
            lap("admit")
        # a co-worker with ``finish`` only launched its GPU work; with the overlap a step goes
        # behind it before the co-worker waits for it
        finish = getattr(cw, "finish", None) if ran else None
        launched = False
        if self._active and (not ran or (finish is not None and c.overlap_steps)):
            self._launch_step()
            launched = True
        lap("step_launch")
        if late:
            self._admit(live, events)
            lap("admit")
        if finish is not None:
            finish()
            lap("cowork_finish")
        events.extend(self._read_launched(self._unread_kept() if launched else 0))
        lap("read")
        self._tell(events[told:])
        lap("tell")
        return events

    def _admit(self, live: List[_Req], events: list) -> None:
        """Admit ``live`` (prefill launched); a request whose first c0 is EOS ends at once
        (an event appended to ``events``)."""
        for r, eos in zip(live, self._admit_many(live)):
            if eos:  # the first c0 is EOS: no frames
                self._release(r)
                r.stopped = True
                events.append((r, None, True))

    def _unread_kept(self) -> int:
        """Launched steps left unread after an iteration that launched one: none without
        ``overlap_steps``, two from ``deep_overlap_rows`` active rows, else one."""
        c = self.config
        if not c.overlap_steps:
            return 0
        return 2 if c.deep_overlap_rows and len(self._active) >= c.deep_overlap_rows else 1

    def _read_launched(self, keep: int) -> List[Tuple[_Req, Optional[np.ndarray], bool]]:
        """Read the launched steps, oldest first, until ``keep`` remain; release the slots of
        the requests that stopped (behind any step still on the GPU)."""
        events = []
        while len(self._inflight) > keep:
            read = self._read_step(self._inflight.popleft())
            for r, _, stop in read:
                if stop and r.slot >= 0:
                    self._release(r)
            events.extend(read)
        return events

    def unread_rows(self) -> Dict[str, int]:
        """Request id -> output row (of ``model.out``) of the launched step not yet read, for
        each row that gives its request a frame (requests not stopped before it); empty unless
        exactly one step is unread. For a co-worker's ``run`` (worker thread): until the loop
        launches its next step, which rewrites ``model.out``, it may read those rows on the
        device, queued behind the step, instead of waiting for the step to be read."""
        if len(self._inflight) != 1:
            return {}
        return {r.req.request_id: i for i, r in enumerate(self._inflight[0].rows) if not r.stopped}

    def _tell(self, events) -> None:
        if self.cowork is not None and events:
            self.cowork.on_events([(r.req.request_id, frames, stop) for r, frames, stop in events])

    def _admissions(self) -> List[_Req]:
        """Waiting requests to admit now (up to ``max_num_seqs`` active), none while
        ``admit_hold_ms`` holds them (:func:`hold_admission`)."""
        c = self.config
        admits = []
        with self._wlock:
            free = c.max_num_seqs - len(self._active)
            if self._waiting and hold_admission(
                c.admit_hold_ms,
                c.admit_hold_requests,
                waiting=len(self._waiting),
                free=free,
                active=len(self._active),
                waited_ms=(time.perf_counter() - self._waiting[0].t_submit) * 1000.0,
                min_rows=c.admit_hold_min_rows,
            ):
                return admits
            while self._waiting and len(admits) < free:
                admits.append(self._waiting.popleft())
        return admits

    def _idle(self) -> bool:
        cw = self.cowork
        idle = not self._active and not self._waiting and not self._inflight
        return idle and (cw is None or not cw.has_work())

    def _deliver(self, events) -> None:
        """Event loop: hand an iteration's events to the streams, then the co-worker's results."""
        cw = self.cowork
        keep = cw is None or not getattr(cw, "frames_to_cowork", False)
        for r, frames, stop in events:
            if keep and frames is not None and not r.aborted:
                r.queue.put_nowait(frames)
            if stop:
                self._finish(r)
        if cw is not None:
            cw.dispatch()

    def _end_open(self, error: Callable[[], BaseException]) -> None:
        """Event loop: the loop stops (it failed, or its task was cancelled, by ``shutdown`` or by
        whoever cancels the event loop's tasks at its close): every request still open ends with
        an ``error()`` of its own, so no stream and no ``abort`` waits for a loop that is gone."""
        for r in list(self._by_id.values()):
            if not r.done:
                r.queue.put_nowait(error())
                self._finish(r)
        on_stop = getattr(self.cowork, "on_stop", None)
        if on_stop is not None:
            on_stop(error)

    def _fail_all(self, e: BaseException) -> None:
        """Event loop: the loop failed; every stream gets the error and ends."""
        self._error = e
        self._end_open(lambda: RuntimeError(f"native engine step failed: {e!r}"))

    async def _scheduler(self) -> None:
        """The loop as an asyncio task: each iteration in the default executor (``loop_thread``
        off)."""
        loop = asyncio.get_running_loop()
        try:
            while not self._closed:
                if self._idle():
                    self._wake.clear()
                    await self._wake.wait()
                    self.loop_time.lap("idle")
                    continue
                events = await loop.run_in_executor(None, self._work, self._admissions())
                self._deliver(events)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self._closed = True  # a later synthesize is refused instead of waiting for no loop
            self._end_open(lambda: EngineError("engine stopped"))
            raise
        except BaseException as e:  # noqa: BLE001 -- fail every stream, keep the message
            self._fail_all(e)
            raise

    async def _scheduler_thread(self) -> None:
        """The loop on a thread of its own (``loop_thread``); this task lives as long as it and
        fails every stream if it fails."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future = loop.create_future()

        def post(fn, *args) -> bool:
            try:
                loop.call_soon_threadsafe(fn, *args)
                return True
            except RuntimeError:  # the event loop is closed: nobody is left to tell
                return False

        def end(err) -> None:
            if not ended.done():
                ended.set_result(err)
            elif err is not None:  # the task was cancelled first: nobody else will report it
                log.error("native engine loop failed after it was stopped: %r", err)

        def deliver(events) -> None:
            try:
                self._deliver(events)
            except BaseException as e:  # noqa: BLE001 -- a stream left without its events would hang
                self._closed = True
                self._twake.set()
                end(e)

        def main() -> None:
            err = None
            try:
                dev = self.model.device
                if dev.type == "cuda" and dev.index is not None:  # a new thread starts on the default device
                    torch.cuda.set_device(dev)
                while not self._closed:
                    self._twake.clear()  # before the checks: a wake() after it is not lost
                    if self._closed:  # shutdown() may have set it (and woken us) just before
                        break
                    if self._idle():
                        self._twake.wait(timeout=1.0)
                        self.loop_time.lap("idle")
                        continue
                    events = self._work(self._admissions())
                    if not post(deliver, events):
                        return
                    self.loop_time.lap("post")
            except BaseException as e:  # noqa: BLE001 -- reported to the task
                err = e
            if not post(end, err) and err is not None:  # the event loop is closed
                log.error("native engine loop failed with its event loop closed: %r", err)

        # The two threads take turns at the GIL: when the loop thread wakes from a GPU wait while
        # the event loop runs Python, it waits for the interpreter's switch interval (5 ms by
        # default) before it can launch the next step; a shorter one bounds that wait.
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=main, name="native-engine-loop", daemon=True)
        self._thread.start()
        try:
            err = await ended
        except asyncio.CancelledError:
            self._closed = True
            self._twake.set()
            self._end_open(lambda: EngineError("engine stopped"))
            raise
        if err is not None:
            self._fail_all(err)
            raise err
