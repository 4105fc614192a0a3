"""The `tts` model's logic, independent of Triton: validate, admit, stream talker -> codec -> audio.

The Triton adapter supplies a :class:`TalkerClient` and a :class:`CodecClient` (BLS calls) and a
``send`` callable; tests can supply in-process fakes. Contract per request: exactly one final
response (audio or error), the talker request is aborted on cancel or error, and the admission
slot is always released.

With several GPUs (the ``gpus`` setting) the adapter supplies one talker and one codec per device,
a *lane* each; :class:`~triton_qwen3_tts.serving.tts.router.Router` admits each request onto the
least-loaded lane, and the request's talker stream, codec session and abort all use that lane.

Nothing waits for ever: a watchdog (:meth:`TtsService.watchdog`, one task on the service's loop)
ends a request that made no progress (no talker frames, no audio sent) for
``request_deadline_s`` with UNAVAILABLE, and when a peer model's process dies (``talker``, the
codec: ``stub_procs.StubWatch``) it ends every request in flight at once and refuses new ones,
since nothing inside a dead stub will ever answer. Clean-up calls (talker abort, codec state
release) are bounded by ``CLEANUP_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Union

import numpy as np

from triton_qwen3_tts.model.config import GenerationDefaults, Qwen3TTSConfig
from triton_qwen3_tts.serving.tts.chunks import ChunkScheduler, ScheduleConfig
from triton_qwen3_tts.serving.tts.admission import Overloaded
from triton_qwen3_tts.serving.tts.router import Router
from triton_qwen3_tts.serving.faults import PeerDied, Stalled
from triton_qwen3_tts.serving.model_config import TtsModelConfig
from triton_qwen3_tts.serving.tts.pipeline import (
    Cancelled,
    StreamResampler,
    forward_audio,
    stream_audio,
    to_sample_format,
)
from triton_qwen3_tts.serving.tts.request import SAMPLING_INPUTS, RequestError, TtsRequest, parse_tts_request
from triton_qwen3_tts.serving.tts.codec_session import LiveCounter, open_session
from triton_qwen3_tts.serving.tts.voice import Encode, ResolvedVoice, VoiceCache, resolve_voice

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
CLEANUP_TIMEOUT_S = 5.0  # a talker abort or codec release that takes longer is abandoned


@dataclass
class _Live:
    """A request in flight, as the watchdog sees it."""

    task: "asyncio.Task"
    touched: float  # clock of the last progress (admission, talker frames, codec audio)
    failure: Optional[BaseException] = None  # set by the watchdog just before it cancels ``task``


class TalkerClient(Protocol):
    def stream(self, request_id: str, inputs: Dict[str, np.ndarray]) -> AsyncIterator[np.ndarray]: ...
    async def abort(self, request_id: str) -> None: ...


class CodecClient(Protocol):
    async def decode(self, codes: np.ndarray, left_context: int) -> np.ndarray: ...

    # Optional: ``session()`` -> an object with ``async decode(codes, left_context)`` and ``close()``
    # or ``async aclose()`` (one per request, e.g. the stateful codec's per-stream state); without
    # it the service wraps ``decode`` (stateful_codec.open_session).


class Sender(Protocol):
    def audio(self, samples: np.ndarray, final: bool, sample_rate: int = SAMPLE_RATE) -> None: ...
    def error(self, err: Exception) -> None: ...  # always final


class _FreeSlotBeforeFinal:
    """Wraps a request's :class:`Sender` so that the admission slot is freed just before the FINAL
    response goes out: a client that sends its next request as soon as it sees FINAL (a closed
    loop at the admission limit) then finds the slot free. ``free()`` is idempotent; the handler
    also calls it in its ``finally`` for paths that end without a FINAL from here."""

    def __init__(self, send: "Sender", free: Callable[[], None]):
        self._send, self._free, self._done = send, free, False

    def free(self) -> None:
        if not self._done:
            self._done = True
            self._free()

    def audio(self, samples: np.ndarray, final: bool, sample_rate: int = SAMPLE_RATE) -> None:
        if final:
            self.free()
        self._send.audio(samples, final, sample_rate)

    def error(self, err: Exception) -> None:
        self.free()
        self._send.error(err)


@dataclass
class Metrics:
    """Hooks for the adapter's Triton custom metrics (no-ops by default)."""

    first_audio: Callable[[float], None] = lambda seconds: None
    first_frames: Callable[[float], None] = lambda seconds: None  # arrival -> the talker's first frames
    codec_call: Callable[[float], None] = lambda seconds: None  # one codec call as the tts waits for it
    frames: Callable[[int], None] = lambda n: None
    audio_seconds: Callable[[float], None] = lambda s: None
    in_flight: Callable[[int], None] = lambda n: None
    refused: Callable[[], None] = lambda: None
    aborted: Callable[[], None] = lambda: None
    codec_states_live: Callable[[int], None] = lambda n: None  # open stateful codec sessions
    voice_cache_hit: Callable[[], None] = lambda: None
    voice_cache_miss: Callable[[], None] = lambda: None
    voice_cache_evicted: Callable[[int], None] = lambda n: None
    voice_cache_size: Callable[[int], None] = lambda n: None
    failed: Callable[[str], None] = lambda reason: None  # the watchdog ended a request ("stalled" | "peer_died")
    # per lane (GPU): its streams in flight after each change, and the frames it decoded
    device_in_flight: Callable[[int, int], None] = lambda device, n: None
    device_frames: Callable[[int, int], None] = lambda device, n: None
    routed: Callable[[int], None] = lambda device: None  # a request admitted onto that lane


@dataclass(frozen=True)
class Lane:
    """One device's pipeline as the tts sees it: its talker and its codec (None: fused)."""

    talker: "TalkerClient"
    codec: Optional["CodecClient"]


def check_prompt(config: Qwen3TTSConfig, req: TtsRequest) -> None:
    """Checkpoint-specific checks (speaker, language, task) before any work is scheduled.

    The reference audio of a Base request is checked by the request parser; its codes and
    x-vector do not exist yet, so the prompt builder checks the rest in x-vector mode.
    """
    from triton_qwen3_tts.model.prompt import PromptRequest, validate_request

    validate_request(
        config,
        PromptRequest(
            task_type=req.task_type,
            text=req.text,
            language=req.language,
            speaker=req.speaker,
            instruct=req.instruct,
            x_vector_only=req.task_type == "Base",
        ),
    )


def talker_inputs(
    req: TtsRequest,
    speaker_embedding: Optional[np.ndarray] = None,
    ref_codes: Optional[np.ndarray] = None,
    response_frames: Optional[Sequence[int]] = None,
) -> Dict[str, np.ndarray]:
    """The talker model's inputs for a validated request. ``response_frames``: the chunk sizes
    the tts consumes, so the talker sends one response per chunk instead of one per frame."""

    def s(v):
        return np.array([v.encode("utf-8")], dtype=object)

    d = {
        "text": s(req.text),
        "task_type": s(req.task_type),
        "language": s(req.language),
        # every sampling input, resolved (the checkpoint's defaults applied here, not in the talker)
        **{
            name: np.array([getattr(req.sampling, name)], np.int32 if name.endswith("top_k") else np.float32)
            for name in SAMPLING_INPUTS
        },
        "max_frames": np.array([req.max_frames], np.int32),
        "ignore_eos": np.array([req.ignore_eos], np.bool_),
    }
    if req.speaker:
        d["speaker"] = s(req.speaker)
    if req.instruct:
        d["instruct"] = s(req.instruct)
    if req.seed is not None:
        d["seed"] = np.array([req.seed], np.int64)
    if req.ref_text and not req.x_vector_only:
        d["ref_text"] = s(req.ref_text)
    if ref_codes is not None:
        d["ref_codes"] = np.ascontiguousarray(ref_codes, dtype=np.int32)
    if speaker_embedding is not None:
        d["speaker_embedding"] = np.ascontiguousarray(speaker_embedding, dtype=np.float32)
    if response_frames:
        d["response_frames"] = np.asarray(list(response_frames), np.int32)
    return d


def schedule_sizes(schedule: ScheduleConfig) -> List[int]:
    """The chunk sizes of a schedule, first to steady (the last one repeats)."""
    return [schedule.chunk_size(i) for i in range(len(schedule.ramp) + 2)]


class TtsService:
    def __init__(
        self,
        cfg: TtsModelConfig,
        model_config: Qwen3TTSConfig,
        talker: Union[TalkerClient, Sequence[TalkerClient]],
        codec: Union[CodecClient, Sequence[Optional[CodecClient]], None],
        metrics: Optional[Metrics] = None,
        prompt_check: Optional[Callable[[Qwen3TTSConfig, TtsRequest], None]] = check_prompt,
        encode: Optional[Encode] = None,
        peers=None,
        clock: Callable[[], float] = time.monotonic,
        generation: Optional[GenerationDefaults] = None,
    ):
        """``encode(audio, sample_rate, need_codes)`` runs the reference encoders (Base
        checkpoints; ``encoders.ReferenceEncoders.encode_async``); results are cached by
        ``voice_id`` in a ``cfg.voice_cache_size`` LRU. ``peers``: an object whose ``poll()``
        returns the peer stub processes that died since the last call
        (``stub_procs.StubWatch``); None = not watched. ``clock``: the watchdog's clock.
        ``generation``: the checkpoint's ``generation_config.json``, the sampling defaults of requests
        that give none (unless the model's parameters set them). ``talker`` and ``codec`` may be
        lists, one per device (lane), of equal length: each request is served on one lane."""
        self.cfg = cfg
        self.model_config = model_config
        self.limits = cfg.limits(model_config.task_type, generation)
        self.schedule = ScheduleConfig(
            first_chunk_frames=cfg.first_chunk_frames,
            ramp=tuple(cfg.chunk_ramp),
            chunk_frames=cfg.chunk_frames,
            # the stateful codec carries the past itself: no left context
            left_context_frames=0 if cfg.codec_mode == "stateful" else cfg.left_context_frames,
        )
        # pipeline fused: the talker sends audio (its engine decodes it); ``codec`` is unused
        self.fused = cfg.pipeline == "fused"
        talkers = list(talker) if isinstance(talker, (list, tuple)) else [talker]
        codecs = list(codec) if isinstance(codec, (list, tuple)) else [codec] * len(talkers)
        if len(codecs) != len(talkers):
            raise ValueError(f"one codec per talker (lane): got {len(talkers)} talkers, {len(codecs)} codecs")
        self.lanes = [Lane(t, c) for t, c in zip(talkers, codecs)]
        self.talker, self.codec = self.lanes[0].talker, self.lanes[0].codec
        self.metrics = metrics or Metrics()
        self.router = Router(
            len(self.lanes),
            cfg.max_in_flight,
            cfg.max_queued,
            on_change=lambda device, n: self.metrics.device_in_flight(device, n),
        )
        self.admission = self.router  # its in_flight: streams admitted on every lane
        self.prompt_check = prompt_check
        self.codec_states = LiveCounter(lambda n: self.metrics.codec_states_live(n))
        self.encode = encode
        m = self.metrics
        self.voices = VoiceCache(
            cfg.voice_cache_size,
            on_hit=lambda: m.voice_cache_hit(),
            on_miss=lambda: m.voice_cache_miss(),
            on_evict=lambda n: m.voice_cache_evicted(n),
            on_size=lambda n: m.voice_cache_size(n),
        )
        self.peers = peers
        self.clock = clock
        self.live: Dict[str, _Live] = {}
        self.broken: Optional[PeerDied] = None  # set once a peer process has died

    def parse(self, inputs: Mapping[str, Any]) -> TtsRequest:
        req = parse_tts_request(inputs, self.limits)
        if req.task_type != self.model_config.task_type:
            raise RequestError(
                "task_type",
                f"{req.task_type!r} is not served by this checkpoint; it serves {self.model_config.task_type!r}",
            )
        if self.prompt_check is not None:
            self.prompt_check(self.model_config, req)
        return req

    async def handle(
        self, inputs: Mapping[str, Any], send: Sender, cancelled: Callable[[], bool] = lambda: False
    ) -> None:
        """Serve one request end to end. Never raises; always sends exactly one final response."""
        t0 = time.monotonic()
        if self.broken is not None:
            send.error(self.broken)
            return
        try:
            req = self.parse(inputs)
        except ValueError as e:  # RequestError or the prompt builder's PromptError
            send.error(e)
            return
        try:
            device = await self.router.acquire()
        except Overloaded as e:
            self.metrics.refused()
            send.error(e)
            return
        self.metrics.in_flight(self.router.in_flight)
        self.metrics.routed(device)

        def free_slot():
            self.router.release(device)
            self.metrics.in_flight(self.router.in_flight)

        send = _FreeSlotBeforeFinal(send, free_slot)
        if self.broken is not None:  # a peer died while this request was queued
            send.error(self.broken)
            return
        rid = f"tts-{uuid.uuid4().hex[:16]}"
        live = _Live(asyncio.current_task(), self.clock())
        self.live[rid] = live
        try:
            await self._serve(req, send, cancelled, rid, live, t0, device)
        finally:
            self.live.pop(rid, None)
            send.free()  # no-op when a FINAL already freed it

    async def _serve(
        self,
        req: TtsRequest,
        send: "_FreeSlotBeforeFinal",
        cancelled: Callable[[], bool],
        rid: str,
        live: _Live,
        t0: float,
        device: int = 0,
    ) -> None:
        finished = False
        session = None
        voice: Optional[ResolvedVoice] = None
        lane = self.lanes[device]

        def touch():
            live.touched = self.clock()

        if req.task_type == "Base":
            try:
                voice = await self._resolve_voice(req)
                req = voice.apply(req)
            except asyncio.CancelledError:
                if live.failure is None:
                    raise
                _uncancel()
                send.error(live.failure)
                return
            except Exception as e:  # noqa: BLE001 - RequestError (INVALID_ARG) or an encoder failure
                if not isinstance(e, RequestError):
                    log.exception("reference encoding of %s failed", rid)
                send.error(e)  # frees the slot first
                return
            touch()
        try:
            if self.fused:  # the talker sends audio
                chunks = forward_audio(
                    self._talker_stream(lane.talker, rid, req, voice, touch),
                    cancelled,
                    on_first_frames=lambda: self.metrics.first_frames(time.monotonic() - t0),
                )
            else:
                session = open_session(lane.codec)
                if getattr(session, "stateful", False):
                    self.codec_states.add(1)
                chunks = await self._split_chunks(lane.talker, req, voice, rid, session, touch, cancelled, t0)
            first = True
            n_frames = 0
            collected = []
            rate = req.sample_rate
            resampler = StreamResampler(SAMPLE_RATE, rate)
            async for chunk in chunks:
                n_frames += chunk.num_frames
                if chunk.samples.size and first:
                    first = False
                    self.metrics.first_audio(time.monotonic() - t0)
                if req.stream:
                    if chunk.samples.size or chunk.final:
                        out = resampler.process(chunk.samples, last=chunk.final)
                        send.audio(to_sample_format(out, req.sample_format), chunk.final, rate)
                else:
                    collected.append(chunk.samples)
                    if chunk.final:
                        out = resampler.process(np.concatenate(collected), last=True)
                        send.audio(to_sample_format(out, req.sample_format), True, rate)
                finished = finished or chunk.final
            self.metrics.frames(n_frames)
            self.metrics.device_frames(device, n_frames)
            self.metrics.audio_seconds(n_frames * 1920 / SAMPLE_RATE)
        except asyncio.CancelledError:
            if live.failure is None:  # not the watchdog: the loop itself is going away
                raise
            _uncancel()  # handled: later awaits (abort, release) run normally
            if not finished:  # the client first: the clean-up below may wait on a stuck peer
                send.error(live.failure)
            finished = True
            if not isinstance(live.failure, PeerDied):
                await self._abort(lane.talker, rid)
        except Cancelled:
            self.metrics.aborted()
            await self._abort(lane.talker, rid)
            if not finished:
                send.error(Cancelled("request cancelled by the client"))
            finished = True
        except RequestError as e:  # the talker refused the request (e.g. prompt too long)
            await self._abort(lane.talker, rid)
            if not finished:
                send.error(e)
            finished = True
        except Exception as e:  # noqa: BLE001 - any failure ends this request only
            log.exception("tts request %s failed", rid)
            await self._abort(lane.talker, rid)
            if not finished:
                send.error(e)
            finished = True
        finally:
            if session is not None:
                try:
                    aclose = getattr(session, "aclose", None)
                    if aclose is not None:  # e.g. a resident-state codec: release its copy of the state
                        await asyncio.wait_for(aclose(), CLEANUP_TIMEOUT_S)
                    else:
                        session.close()
                except (Exception, asyncio.TimeoutError):  # noqa: BLE001
                    log.exception("closing the codec session of %s failed", rid)
                if getattr(session, "stateful", False):
                    self.codec_states.add(-1)

    def _talker_stream(self, talker, rid, req, voice, touch, response_frames=None):
        """The talker's stream for ``req`` (frames, or audio with the fused pipeline), calling
        ``touch()`` as items arrive."""
        inputs = talker_inputs(
            req,
            None if voice is None else voice.speaker_embedding,
            None if voice is None else voice.ref_codes,
            response_frames,
        )
        return _touching(talker.stream(rid, inputs), touch)

    async def _split_chunks(self, talker, req, voice, rid, session, touch, cancelled, t0):
        """The split pipeline's audio chunks: talker frames through the chunk schedule into the
        codec ``session`` (primed with a Base voice's reference codes first)."""
        prefix = None
        if voice is not None and voice.ref_codes is not None:
            prefix = voice.ref_codes  # decoder context only, as in the official wrapper
            if getattr(session, "stateful", False):
                await self._prime(session, prefix)
                prefix = None
        frames = self._talker_stream(talker, rid, req, voice, touch, schedule_sizes(self.schedule))

        async def decode(codes, left_context, _decode=session.decode):
            t = time.monotonic()
            try:
                out = await _decode(codes, left_context)
            finally:
                self.metrics.codec_call(time.monotonic() - t)
            touch()
            return out

        return stream_audio(
            frames,
            decode,
            ChunkScheduler(self.schedule),
            cancelled,
            prefix=prefix,
            left_context_frames=self.schedule.left_context_frames,
            on_first_frames=lambda: self.metrics.first_frames(time.monotonic() - t0),
        )

    async def _resolve_voice(self, req: TtsRequest) -> ResolvedVoice:
        if self.encode is None:
            raise RuntimeError("this tts model has no reference encoders (task_type Base needs them)")
        return await resolve_voice(req, self.voices, self.encode)

    async def _prime(self, session, prefix: np.ndarray) -> None:
        """Feed the reference codes to a stateful codec session; their audio is dropped."""
        step = max(1, self.cfg.chunk_frames)
        for i in range(0, prefix.shape[0], step):
            await session.decode(prefix[i : i + step], 0)

    async def _abort(self, talker: TalkerClient, rid: str) -> None:
        if self.broken is not None:  # the talker may be the process that died: nothing would answer
            return
        try:
            await asyncio.wait_for(talker.abort(rid), CLEANUP_TIMEOUT_S)
        except (Exception, asyncio.TimeoutError):  # noqa: BLE001
            log.exception("abort of talker request %s failed", rid)

    # -- watchdog --------------------------------------------------------------------------------
    def check(self) -> None:
        """One watchdog pass: notice dead peers, then end every request that must end (all of
        them once a peer died; those without progress for ``request_deadline_s`` otherwise)."""
        if self.peers is not None and self.broken is None:
            dead = self.peers.poll()
            if dead:
                what = "; ".join(
                    f"the {s.model} model's process (instance {s.instance}, pid {s.pid}) died" for s in dead
                )
                self.broken = PeerDied(f"{what}: this server cannot serve until it is restarted")
                log.error("%s", self.broken)
        now = self.clock()
        deadline = self.cfg.request_deadline_s
        for live in list(self.live.values()):
            if live.failure is not None or live.task.done():
                continue
            if self.broken is not None:
                live.failure = self.broken
                self.metrics.failed("peer_died")
            elif now - live.touched > deadline:
                live.failure = Stalled(
                    f"request_deadline_s: no progress for {now - live.touched:.1f} s "
                    f"(limit {deadline:g} s); the request was stopped"
                )
                self.metrics.failed("stalled")
            else:
                continue
            live.task.cancel()

    async def watchdog(self, interval: Optional[float] = None) -> None:
        """Run :meth:`check` every ``interval`` seconds (default: a quarter of the deadline, at
        most 1 s) until cancelled. The adapter starts it on the service's loop."""
        interval = interval or min(1.0, self.cfg.request_deadline_s / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one failure
                log.exception("tts watchdog pass failed")


def _uncancel() -> None:
    """Clear the current task's pending-cancel count (Python 3.11+) after a watchdog cancel has
    been handled, so the timeouts of the clean-up awaits behave as in a task never cancelled."""
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    if uncancel is not None:
        uncancel()


async def _touching(frames: AsyncIterator[np.ndarray], touch: Callable[[], None]) -> AsyncIterator[np.ndarray]:
    """``frames``, calling ``touch()`` as each item arrives (talker progress); closes ``frames``
    when the consumer stops early."""
    try:
        async for item in frames:
            touch()
            yield item
    finally:
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()
