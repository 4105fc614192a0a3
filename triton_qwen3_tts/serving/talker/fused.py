"""The fused pipeline: the native talker engine decodes audio too, in one scheduler loop.

:class:`FusedPipeline` is the native engine's co-worker (``NativeEngine.cowork``, see
``engines/native/engine.py``): the engine's loop asks it, each iteration, whether to run a
batched stateful-codec call instead of a talker step, and :class:`DeadlinePolicy`
(``serving/talker/deadline.py``) answers by playback deadline. Talker and codec share one process,
one CUDA context and one stream, so their kernels never time-slice against each other, and the
codec state of every stream stays in a :class:`StatePool` on the device (the resident-state code
of ``codec_decoder_stateful``: ``serving/codec/stateful.py``).

Interface, like the engines' (``TalkerService`` takes it as its engine)::

    pipe = FusedPipeline(engine, codec, pool, policy)
    async for audio in pipe.synthesize(TalkerRequest(...), prefix=ref_codes):   # float32 [n]
        ...
    await pipe.abort(request_id); pipe.stats(); pipe.shutdown()

``prefix`` (Base in-context voice cloning: the reference codes ``[P, 16]``) primes the stream's
codec state before its first frame; its audio is never sent (as the official wrapper decodes
``concat(ref_codes, generated)`` and drops the reference's samples).

Threads: ``synthesize`` and ``dispatch`` run on the event loop; ``run``, ``finish`` and
``on_events`` where the engine's loop runs its iterations (its own thread with
``native_loop_thread``, else the event loop's executor), at the same time as the event loop's
parts; ``has_work`` where the loop decides to idle (that thread, or the event loop between
iterations). The loop side only appends commands to ``_cmds`` and the worker side only appends
results to ``_out`` (deques: thread-safe appends and pops); the stream table belongs to the
worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Sequence

import numpy as np

from triton_qwen3_tts.engines.native.gputime import GpuTimer, HostEvent
from triton_qwen3_tts.serving.codec.batch import NUM_QUANTIZERS
from triton_qwen3_tts.serving.settings import default

from triton_qwen3_tts.serving.codec.stateful import (
    ResidentRequest,
    StateCapacityError,
    run_resident_batch,
    to_device_async,
)
from triton_qwen3_tts.serving.talker.deadline import FRAME_SECONDS, DeadlinePolicy, StreamState

log = logging.getLogger(__name__)

_END = object()

# Histogram bounds (seconds) of the slack at each chunk sent and of the scheduling lag
SLACK_BUCKETS = (-0.5, -0.1, 0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
WAIT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.5, 1.0)
REST_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class Histogram:
    """Cumulative-style counts for fixed upper bounds (Prometheus ``le`` buckets) plus +Inf."""

    bounds: Sequence[float]
    counts: List[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self):
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        self.n += 1
        self.total += v
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1


@dataclass
class FusedStats:
    codec_calls: int = 0
    codec_rows: int = 0
    codec_frames: int = 0
    codec_seconds: float = 0.0  # wall time of the codec calls (each ends with a host sync)
    chunks: int = 0
    lent: int = 0  # first chunks' last frames taken from the engine's unread step on the device
    padded: int = 0  # frames of padding decoded with finished streams' last chunks (finish pad)
    misses: int = 0  # chunks sent after the client's buffer ran dry (server-side underruns)
    slack: Histogram = field(default_factory=lambda: Histogram(SLACK_BUCKETS))
    lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))
    batch: Histogram = field(default_factory=lambda: Histogram(BATCH_BUCKETS))
    # a stream's time from its opening to its first frame from the engine (admission wait,
    # prefill, first step), and from its last frame to its end (its last chunks' decodes): the
    # time a closed-loop client's stream holds no talker row
    first_frame: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    tail: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    # frames a stream still had to decode when its last frame came (what its tail decodes)
    rest: Histogram = field(default_factory=lambda: Histogram(REST_BUCKETS))
    reasons: Dict[str, int] = field(default_factory=dict)
    # (name, value) of every observation not yet exported (the histograms' names); the Triton
    # adapter drains it into its histograms (serving/talker/triton.py)
    unexported: Deque[tuple] = field(default_factory=deque)

    def observe(self, name: str, value: float) -> None:
        getattr(self, name).observe(value)
        if len(self.unexported) < 100000:  # bounded if nobody exports
            self.unexported.append((name, value))


@dataclass(eq=False)
class _Stream:
    rid: str
    state: StreamState
    frames: List[np.ndarray] = field(default_factory=list)  # pending frames, [n, 16] each
    ended: bool = False  # its last item (audio end or an error) is out
    skip: int = 0  # frames decoded from the device before the engine read them (dropped then)
    framed: bool = False  # its first frame came from the engine
    t_done: Optional[float] = None  # when the engine said it sent its last frame

    def take(self, n: int) -> np.ndarray:
        """The first ``n`` pending frames ``[n, 16]`` (removed)."""
        if n == 0:
            return np.zeros((0, NUM_QUANTIZERS), np.int64)
        codes = np.concatenate(self.frames) if len(self.frames) > 1 else self.frames[0]
        rest = codes[n:]
        self.frames = [rest] if rest.shape[0] else []
        self.state.pending -= n
        return codes[:n]


class FusedPipeline:
    fused = True  # TalkerService: synthesize yields audio and takes ``prefix``
    frames_to_cowork = True  # the engine hands frames to on_events only (its synthesize yields none)

    def __init__(
        self,
        engine,
        codec,
        pool,
        policy: DeadlinePolicy,
        clock: Callable[[], float] = time.monotonic,
        prime_frames: int = 50,
        first_on_device: bool = True,
    ):
        """``engine``: a started NativeEngine (it gets this object as its co-worker);
        ``codec``: a StatefulCodecDecoder or StatefulGraphRunner (``step(codes, state)``);
        ``pool``: the StatePool holding every stream's codec state; ``prime_frames``: frames per
        codec call when a prefix primes a stream; ``first_on_device`` (the setting
        ``fused_first_on_device``): a first chunk whose last frame is in the engine's unread step
        takes that frame on the device (:meth:`run`), else the engine reads the step first
        (:meth:`read_first`)."""
        self.engine = engine
        self.codec = codec
        self.pool = pool
        self.policy = policy
        self.clock = clock
        self.prime_frames = int(prime_frames)
        self.device = pool.buf.device
        self._cmds: Deque[tuple] = deque()
        self._out: Deque[tuple] = deque()
        self._streams: Dict[str, _Stream] = {}  # worker-owned
        self._by_sid: Dict[int, _Stream] = {}
        self._queues: Dict[str, asyncio.Queue] = {}  # loop-owned
        self._sids = itertools.count(1)
        self.fused_stats = FusedStats()
        # ``run`` leaves a codec call's audio to ``finish``, which the engine calls next; with
        # its overlap it launches a step in between, so on a GPU the audio is then copied to the
        # host without blocking (``_defer``). ``_unread``: the call ``finish`` is to hand out.
        self._defer = bool(getattr(getattr(engine, "config", None), "overlap_steps", False))
        self._unread: Optional[tuple] = None
        # the codec calls' timer when the engine has none: their events still mark the audio's
        # copy done for ``finish``
        self._own_timer = GpuTimer(True, event=None if self.device.type == "cuda" else HostEvent)
        self._first_on_device = bool(first_on_device) and hasattr(engine, "unread_rows")
        engine.cowork = self

    @property
    def _gpu_time(self) -> GpuTimer:
        """The engine's GPU timer (the codec calls' time beside its steps and prefills, in its
        stats' ``gpu_ms``); one of this pipeline's own for engines without an enabled one."""
        t = getattr(self.engine, "gpu_time", None)
        return t if t is not None and t.enabled else self._own_timer

    # -- the engine-like interface (event loop) -----------------------------------------------
    @property
    def model(self):
        return self.engine.model

    def check_request(self, req):
        return self.engine.check_request(req)

    async def synthesize(self, req, prefix: Optional[np.ndarray] = None):
        """Yield the request's audio, float32 ``[n]`` per chunk, in order; ends after the last."""
        self.engine.check_request(req)  # EngineError before anything is scheduled
        rid = req.request_id
        if rid in self._queues:
            from triton_qwen3_tts.engines.base import EngineError

            raise EngineError(f"request_id {rid!r} is already in flight")
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        pre = None if prefix is None else np.asarray(prefix, np.int64).reshape(-1, 16)
        self._cmds.append(("open", rid, pre, self.clock()))
        drain = asyncio.ensure_future(self._drain(self.engine.synthesize(req), q))
        try:
            while True:
                item = await q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._queues.pop(rid, None)
            if not drain.done():
                drain.cancel()  # the engine generator's clean-up aborts the talker request
                await asyncio.gather(drain, return_exceptions=True)
            self._cmds.append(("close", rid))
            self.engine.wake()

    @staticmethod
    async def _drain(frames, q: asyncio.Queue) -> None:
        """Run the talker request (its frames reach us through ``on_events``, none through
        ``frames``: ``frames_to_cowork``); report failures."""
        try:
            async for _ in frames:
                pass
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the consumer re-raises it
            q.put_nowait(e)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> dict:
        st = self.fused_stats
        return {
            **self.engine.stats(),
            "codec_states": self.pool.live,
            "codec_calls": st.codec_calls,
            "codec_rows": st.codec_rows,
            "codec_frames": st.codec_frames,
            "codec_seconds": round(st.codec_seconds, 3),
            "reasons": dict(st.reasons),
            "chunks": st.chunks,
            "first_frames_on_device": st.lent,
            "padded_frames": st.padded,
            "deadline_misses": st.misses,
        }

    def shutdown(self) -> None:
        self.engine.shutdown()

    # -- co-worker: event loop side ----------------------------------------------------------
    def has_work(self) -> bool:
        """Work for the loop's iterations: commands to apply, frames to decode, streams to end.
        (Results in ``_out`` are not: every iteration's ``dispatch`` hands them out.)"""
        return bool(self._cmds) or any(
            not s.ended and (s.state.pending > 0 or s.state.talker_done) for s in self._streams.values()
        )

    def dispatch(self) -> None:
        while self._out:
            rid, item = self._out.popleft()
            q = self._queues.get(rid)
            if q is not None:
                q.put_nowait(item)

    def on_stop(self, error: Callable[[], BaseException]) -> None:
        """The engine's loop stopped: every stream still open ends with ``error()`` (its talker
        request may be done already, its last audio waiting for codec calls that will not run);
        results the loop handed out before it stopped go first."""
        self.dispatch()
        for q in list(self._queues.values()):
            q.put_nowait(error())

    # -- co-worker: worker thread side --------------------------------------------------------
    def _apply_commands(self) -> None:
        while self._cmds:
            cmd = self._cmds.popleft()
            if cmd[0] == "open":
                _, rid, prefix, t = cmd
                st = _Stream(rid, StreamState(next(self._sids), t))
                self._streams[rid] = st
                self._by_sid[st.state.sid] = st
                try:
                    self.pool.open(st.state.sid)
                    if prefix is not None and prefix.shape[0]:
                        self._prime(st, prefix)
                except Exception as e:  # noqa: BLE001 - StateCapacityError (UNAVAILABLE) or a decode failure
                    self._fail(st, e if isinstance(e, StateCapacityError) else RuntimeError(f"codec priming: {e}"))
            else:
                st = self._streams.pop(cmd[1], None)
                if st is not None:
                    self._by_sid.pop(st.state.sid, None)
                    self.pool.release(st.state.sid)

    def _prime(self, st: _Stream, prefix: np.ndarray) -> None:
        import torch

        for i in range(0, prefix.shape[0], self.prime_frames):
            piece = torch.from_numpy(np.ascontiguousarray(prefix[i : i + self.prime_frames]))[None]
            (res,) = run_resident_batch(
                [ResidentRequest(st.state.sid, to_device_async(piece, self.device), False, False)],
                self.pool,
                self.codec,
            )
            if isinstance(res, BaseException):
                raise res

    def _fail(self, st: _Stream, err: BaseException) -> None:
        if not st.ended:
            st.ended = True
            st.frames, st.state.pending = [], 0
            self._out.append((st.rid, err))

    def read_first(self, request_ids) -> bool:
        """Whether one more frame of a stream in ``request_ids`` (rows of the engine's unread
        step) completes its first chunk: the engine then reads that step before ``run``, so the
        first chunk's codec call does not queue behind the next talker step (a step's time added
        to the time to first audio)."""
        if self._first_on_device:
            return False  # run takes that frame on the device instead
        first = self.policy.first_chunk_frames
        for rid in request_ids:
            st = self._streams.get(rid)
            if st is not None and not st.ended and st.state.chunks == 0 and st.state.pending + 1 >= first:
                return True
        return False

    def run(self, talker_busy: bool) -> bool:
        """One codec batch if the policy wants one now (True), else False (a talker step). The
        call is only launched: ``finish``, which the engine calls next (with ``overlap_steps``
        once it has launched its next step), reads its audio and hands it out."""
        self._apply_commands()
        live = [s.state for s in self._streams.values() if not s.ended]
        first = self.policy.first_chunk_frames
        lent = self._lend_unread(first)
        urgent = any(s.chunks == 0 and not s.talker_done and s.pending < first for s in live)
        now = self.clock()
        batch = self.policy.pick(live, now, talker_busy, urgent)
        picked = set(batch.sids) if batch is not None else set()
        for sid in [sid for sid in lent if sid not in picked]:  # not decoded now: the engine reads it
            self._by_sid[sid].state.pending -= 1
            del lent[sid]
        if batch is None:
            return False
        import torch

        streams = [self._by_sid[sid] for sid in batch.sids]
        # one host-to-device copy for the batch's codes [b, T, 16]; each request a view of it;
        # a lent frame's place is filled on the device from the engine's unread step
        # a finished stream's rest may be shorter than the call (the policy's ``finish`` pad): its
        # codes are padded with its last frame and the padding's audio dropped in ``finish``
        parts, real = [], []
        for st in streams:
            if st.state.sid in lent:
                host = st.take(batch.frames - 1)
                st.state.pending -= 1
                st.skip += 1
                parts.append(np.concatenate([host, np.zeros((1, host.shape[1]), np.int64)]))
                real.append(batch.frames)
            else:
                n = min(st.state.pending, batch.frames)
                codes = st.take(n)
                if n < batch.frames:
                    codes = np.concatenate([codes, np.repeat(codes[-1:], batch.frames - n, axis=0)])
                parts.append(codes)
                real.append(n)
        codes = np.stack(parts).astype(np.int64, copy=False)
        on_dev = to_device_async(torch.from_numpy(codes), self.device)
        if lent:
            at = [i for i, st in enumerate(streams) if st.state.sid in lent]
            idx = to_device_async(
                torch.tensor([at, [lent[streams[i].state.sid] for i in at]], dtype=torch.int64), self.device
            )
            out = self.engine.model.out
            on_dev[idx[0], -1] = out[idx[1], : on_dev.shape[2]].to(on_dev.dtype)
            self.fused_stats.lent += len(at)
        reqs = [ResidentRequest(st.state.sid, on_dev[i : i + 1], False, False) for i, st in enumerate(streams)]
        defer = self._defer and self.device.type == "cuda"
        timer = self._gpu_time
        t0 = timer.start()
        # ends with the audio's copy to the host, or (defer) with that copy launched
        results = run_resident_batch(reqs, self.pool, self.codec, defer_copy=defer)
        ready = timer.stop(f"codec_{batch.reason}", t0)  # marks the audio's copy done
        self._unread = (batch, streams, real, results, ready, now)
        return True

    def _lend_unread(self, first: int) -> Dict[int, int]:
        """With ``first_on_device``: the streams whose first chunk lacks only the frame of the
        engine's unread step (their ``pending`` counts it from here; :meth:`run` gives it back
        unless the policy decodes them now), as ``{sid: output row}``."""
        if not self._first_on_device:
            return {}
        want = [
            st
            for st in self._streams.values()
            if not (st.ended or st.state.chunks or st.state.talker_done or st.skip) and st.state.pending + 1 == first
        ]
        rows = self.engine.unread_rows() if want else {}
        lent = {}
        for st in want:
            if st.rid in rows:
                st.state.pending += 1
                lent[st.state.sid] = rows[st.rid]
        return lent

    def finish(self) -> None:
        """Hand out the audio of the codec call ``run`` launched (waiting for it on the GPU)."""
        if self._unread is None:
            return
        batch, streams, real, results, ready, now = self._unread
        self._unread = None
        clock = getattr(self.engine, "loop_time", None)
        if clock is not None:
            clock.wait("wait_codec", ready)
        else:
            ready.synchronize()
        self._gpu_time.collect()
        t_end = self.clock()
        stats = self.fused_stats
        stats.codec_seconds += t_end - now
        now = t_end
        stats.codec_calls += 1
        stats.codec_rows += len(streams)
        stats.codec_frames += sum(real)
        stats.padded += len(streams) * batch.frames - sum(real)
        stats.observe("batch", len(streams))
        stats.reasons[batch.reason] = stats.reasons.get(batch.reason, 0) + 1
        for st, n, res in zip(streams, real, results):
            if isinstance(res, BaseException):
                self._fail(st, res)
                continue
            audio = res.numpy()
            if n < batch.frames:  # padded: the real frames' audio only
                audio = audio[: n * (audio.size // batch.frames)]
            s = st.state
            if s.t_ready is not None:
                stats.observe("lag", now - s.t_ready)
                s.t_ready = None
            slack = s.slack(now)
            if slack is not None:
                stats.observe("slack", slack)
                if slack < 0:
                    stats.misses += 1
            if s.t_first is None:
                s.t_first = now
            s.delivered += n
            s.chunks += 1
            stats.chunks += 1
            self._out.append((st.rid, audio))
        self._end_finished()

    def on_events(self, events) -> None:
        # a request admitted in this iteration may already end here (its first token EOS, read
        # at its admission) before ``run`` has applied its "open": apply the commands first, or
        # its end would find no stream and the consumer would wait for ever
        self._apply_commands()
        for rid, frames, finished in events:
            st = self._streams.get(rid)
            if st is None or st.ended:
                continue
            if frames is not None:
                if not st.framed:
                    st.framed = True
                    self.fused_stats.observe("first_frame", self.clock() - st.state.t_submit)
                if st.skip:  # decoded from the device already (run)
                    st.skip -= 1
                else:
                    st.frames.append(np.asarray(frames))
                    st.state.pending += int(frames.shape[0])
            if finished:
                st.state.talker_done = True
                st.t_done = self.clock()
                self.fused_stats.observe("rest", st.state.pending)
        self._end_finished()

    def _end_finished(self) -> None:
        for st in list(self._streams.values()):
            if st.state.finished and not st.ended:
                st.ended = True
                self._out.append((st.rid, _END))
                if st.t_done is not None:
                    self.fused_stats.observe("tail", self.clock() - st.t_done)


def device_time_increments(gpu_ms: Dict[str, dict], seen: Dict[str, tuple]) -> List[tuple]:
    """What the per-kind device-time counters gain since the last call, from the engine's
    cumulative ``stats()["gpu_ms"]`` (kind -> ``{"ms", "calls"}``; its ``gpu_gap_ms`` has the
    same shape, by transition): ``(kind, seconds, launches)`` for each kind whose totals grew.
    ``seen`` (kind -> ``(ms, calls)`` exported so far) is updated; a total never counts down."""
    out = []
    for kind, v in gpu_ms.items():
        ms, n = float(v["ms"]), int(v["calls"])
        ms0, n0 = seen.get(kind, (0.0, 0))
        if ms > ms0 or n > n0:
            out.append((kind, max(0.0, ms - ms0) / 1000.0, max(0, n - n0)))
            seen[kind] = (max(ms, ms0), max(n, n0))
    return out


def frame_buckets(first_chunk_frames: int, ramp: Sequence[int], chunk_frames: int) -> tuple:
    """The codec's CUDA-graph frame counts for the fused pipeline: powers of two up to
    ``chunk_frames`` plus the chunk schedule's sizes (every pending count rounds down to one)."""
    vals = {1, first_chunk_frames, chunk_frames, *ramp}
    b = 2
    while b < chunk_frames:
        vals.add(b)
        b *= 2
    return tuple(sorted(v for v in vals if 1 <= v <= chunk_frames))


def deadline_policy(
    first_chunk_frames: int,
    ramp: Sequence[int],
    chunk_frames: int,
    buffer_ms: float,
    max_batch: int,
    ride_along: str = default("fused_ride_along"),
    finish: str = default("fused_finish"),
    ahead_batch: int = default("fused_ahead_batch"),
) -> DeadlinePolicy:
    """The fused pipeline's policy from its settings (``first_chunk_frames``, ``chunk_ramp``,
    ``chunk_frames``, ``fused_buffer_ms``, ``codec_max_batch_size``, ``fused_ride_along``,
    ``fused_finish``, ``fused_ahead_batch``): a
    stream is critical below half its buffer target (at most 150 ms), and the codec's frame
    counts are :func:`frame_buckets`'."""
    return DeadlinePolicy(
        first_chunk_frames=first_chunk_frames,
        ramp=tuple(ramp),
        chunk_frames=chunk_frames,
        buffer_s=buffer_ms / 1000.0,
        urgent_s=min(0.15, buffer_ms / 2000.0),
        max_batch=max_batch,
        frame_buckets=frame_buckets(first_chunk_frames, ramp, chunk_frames),
        ride_along=ride_along,
        finish=finish,
        ahead_batch=ahead_batch,
    )


__all__ = [
    "FusedPipeline",
    "FusedStats",
    "Histogram",
    "REST_BUCKETS",
    "WAIT_BUCKETS",
    "deadline_policy",
    "device_time_increments",
    "frame_buckets",
    "FRAME_SECONDS",
]
