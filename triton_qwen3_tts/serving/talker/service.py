"""The `talker` model's logic, independent of Triton: inputs -> prompt -> engine -> frames (or,
with the fused pipeline as its engine, ``serving/talker/fused.py``, audio chunks).

Inputs are those of ``model_repository/talker/config.pbtxt.in``. The engine is any object with
``async synthesize(TalkerRequest)`` yielding int32 ``[n, 16]``, ``async abort(request_id)`` and
``shutdown()`` (the vLLM ``TalkerEngine`` or the native engine).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, Mapping

import numpy as np

from triton_qwen3_tts.model.prompt import PromptError, PromptRequest
from triton_qwen3_tts.serving.talker.coalesce import FrameCoalescer, check_response_frames
from triton_qwen3_tts.serving.errors import as_request_error
from triton_qwen3_tts.serving.tts.request import SAMPLING_INPUTS, RequestError, _scalar, check_sampling

log = logging.getLogger(__name__)

TALKER_INPUTS = {
    "text": "str",
    "task_type": "str",
    "speaker": "str",
    "language": "str",
    "instruct": "str",
    "ref_text": "str",
    "temperature": "float",
    "top_k": "int",
    "top_p": "float",
    "repetition_penalty": "float",
    "subtalker_temperature": "float",
    "subtalker_top_k": "int",
    "subtalker_top_p": "float",
    "seed": "int",
    "max_frames": "int",
    "ignore_eos": "bool",
}


@dataclass
class TalkerStats:
    started: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    responses: int = 0  # frame arrays yielded (Triton responses carrying codes)


class TalkerService:
    # Prompts are built (tokenized, and their text rows projected: two 2048 x 2048 GEMMs per
    # row for the 1.7B model, on the CPU or, with prompt_device auto, on the engine's GPU) on
    # threads of their own: on the event loop, which also turns the engine, each would stall
    # every stream's next step, and a burst of new requests would stall it for as many builds in
    # a row. Two threads: builds overlap the engine and each other without taking every core
    # from it.
    PROMPT_THREADS = 2

    def __init__(self, frontend, engine, default_max_frames: int = 2048, max_top_k: int = 2048):
        self.frontend = frontend
        self.engine = engine
        self._prompts = ThreadPoolExecutor(self.PROMPT_THREADS, thread_name_prefix="talker-prompt")
        self.default_max_frames = default_max_frames
        self.max_top_k = max_top_k
        self.live: Dict[str, asyncio.Task] = {}
        self._aborted_ids: set = set()  # live requests an abort request has reached
        self.stats = TalkerStats()

    def parse(self, request_id: str, inputs: Mapping[str, Any]):
        """Validate inputs; return the engine request (prompt built). Raises RequestError/PromptError."""
        from triton_qwen3_tts.engines.base import TalkerRequest

        v = {k: _scalar(k, inputs.get(k), kind) for k, kind in TALKER_INPUTS.items()}
        if v["text"] is None:
            raise RequestError("text", "is required")
        # defaults: the official generation config (the tts sends every sampling input, resolved)
        sp = check_sampling({k: v[k] for k in SAMPLING_INPUTS}, max_top_k=self.max_top_k)
        max_frames = self.default_max_frames if v["max_frames"] is None else v["max_frames"]
        if max_frames < 1:
            raise RequestError("max_frames", f"must be >= 1, got {max_frames}")
        ref_codes = inputs.get("ref_codes")
        spk = inputs.get("speaker_embedding")
        task = v["task_type"] or self.frontend.config.task_type
        preq = self.frontend.validate(
            PromptRequest(
                task_type=task,
                text=v["text"],
                language=v["language"] or "auto",
                speaker=v["speaker"],
                instruct=v["instruct"],
                ref_text=v["ref_text"],
                ref_codes=None if ref_codes is None else np.asarray(ref_codes).reshape(-1, 16),
                x_vector_only=task == "Base" and ref_codes is None,
            )
        )
        if preq.task_type == "Base":
            if spk is None:
                raise RequestError("speaker_embedding", "is required for task_type Base")
            spk = np.asarray(spk, np.float32).reshape(-1)
            if spk.shape[0] != self.frontend.config.talker.hidden_size or not np.all(np.isfinite(spk)):
                raise RequestError(
                    "speaker_embedding", f"must be {self.frontend.config.talker.hidden_size} finite floats"
                )
        elif spk is not None:
            raise RequestError("speaker_embedding", "is only used with task_type Base")
        built = self.frontend.build(preq, spk)
        return TalkerRequest(
            request_id=request_id,
            prompt_embeds=built.prompt_embeds,
            trailing=built.trailing,
            max_frames=max_frames,
            # temperature 0: greedy (the official do_sample / subtalker_dosample False)
            greedy=sp.temperature == 0.0,
            temperature=sp.temperature or 1.0,
            top_k=sp.top_k,
            top_p=sp.top_p,
            repetition_penalty=sp.repetition_penalty,
            sub_greedy=sp.subtalker_temperature == 0.0,
            sub_temperature=sp.subtalker_temperature or 1.0,
            sub_top_k=sp.subtalker_top_k,
            sub_top_p=sp.subtalker_top_p,
            seed=v["seed"],
            suppress_eos=bool(v["ignore_eos"] or False),
        )

    async def stream(self, request_id: str, inputs: Mapping[str, Any]) -> AsyncIterator[np.ndarray]:
        """Yield frames; the engine request is aborted if the consumer stops early or fails.
        With the ``response_frames`` input, each yield ends on a boundary of those chunk sizes
        (``coalesce.py``): one Triton response per chunk instead of one per engine step."""
        from triton_qwen3_tts.engines.base import EngineError

        try:
            req = await asyncio.get_running_loop().run_in_executor(self._prompts, self.parse, request_id, inputs)
        except (PromptError, EngineError) as e:
            raise as_request_error(e) from None  # the field it names, written once
        fused = getattr(self.engine, "fused", False)  # the engine yields audio chunks, not frames
        try:
            coalescer = FrameCoalescer(None if fused else check_response_frames(inputs.get("response_frames")))
        except ValueError as e:
            raise RequestError("response_frames", str(e)) from None
        extra = {}
        if fused and inputs.get("ref_codes") is not None:  # in-context cloning: codec context
            extra["prefix"] = np.asarray(inputs["ref_codes"]).reshape(-1, 16)
        self.live[request_id] = asyncio.current_task()
        self.stats.started += 1
        done = False
        try:
            try:
                agen = self.engine.synthesize(req, **extra)
                async for frames in agen:
                    out = coalescer.push(frames)
                    if out is not None:
                        self.stats.responses += 1
                        yield out
                tail = coalescer.flush()
                if tail is not None:
                    self.stats.responses += 1
                    yield tail
            except EngineError as e:  # refused before scheduling (too long, frame limit, top-k)
                raise as_request_error(e) from None  # EngineError.field: the input refused
            done = True
        finally:
            self.live.pop(request_id, None)
            # An engine may end an aborted request's stream normally (the native engine does):
            # count it as aborted all the same.
            aborted = not done or request_id in self._aborted_ids
            self._aborted_ids.discard(request_id)
            if aborted:
                self.stats.aborted += 1
            else:
                self.stats.finished += 1
            if not done:
                try:
                    await self.engine.abort(request_id)
                except Exception:  # noqa: BLE001
                    log.exception("engine abort of %s failed", request_id)

    # The warm-up's texts: a short one, and one of about 300 characters, so that a long text's
    # first request does not pay for what only long prompts use the first time (on the H100 the
    # first request of a 300-character text waited 64-99 ms for first audio against 25-35 for
    # every other request, its second one 27 ms: run 30, docs/benchmark-history.md).
    WARMUP_TEXTS = (
        "warm up",
        "Once upon a time, in a small village at the edge of a great forest, there lived an old "
        "clockmaker who spent his days repairing watches for travellers. One winter evening a stranger "
        "knocked on his door, carrying a clock that had not ticked for a hundred years.",
    )

    async def warmup(self) -> None:
        """Project a text row on every prompt thread at once (each thread's first projection on a
        GPU makes its cuBLAS handle), then serve one short and one long greedy request of two
        frames each (``WARMUP_TEXTS``), so readiness means the engine has served requests."""
        await self._warm_prompt_threads()
        for text in self.WARMUP_TEXTS:
            inputs = {
                "text": np.array([text.encode()], dtype=object),
                "max_frames": np.array([2], np.int32),
                "temperature": np.array([0.0], np.float32),
            }
            if self.frontend.config.task_type == "VoiceDesign":
                inputs["instruct"] = np.array([b"a calm voice"], dtype=object)
            if self.frontend.config.task_type == "Base":
                inputs["speaker_embedding"] = np.zeros(self.frontend.config.talker.hidden_size, np.float32)
            async for _ in self.stream(f"warmup-{uuid.uuid4().hex[:8]}", inputs):
                pass

    async def _warm_prompt_threads(self) -> None:
        embedder = getattr(self.frontend, "embedder", None)
        if embedder is None:
            return
        barrier = threading.Barrier(self.PROMPT_THREADS)
        pad = [self.frontend.config.tts_pad_token_id]

        def project() -> None:
            import torch

            barrier.wait(timeout=60)  # every job on a thread of its own: the pool starts them all
            with torch.inference_mode():
                embedder.embed_text(pad)

        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._prompts, project) for _ in range(self.PROMPT_THREADS)))

    async def abort(self, request_id: str) -> bool:
        """Abort a live request by id (the tts model's explicit abort). True if it was live."""
        task = self.live.get(request_id)
        if task is not None:
            self._aborted_ids.add(request_id)
        await self.engine.abort(request_id)
        if task is not None:
            task.cancel()
        return task is not None


def lane_snapshot(service) -> Dict[str, Any]:
    """What the tts exports of one fused lane (``TalkerService`` over a ``FusedPipeline``): its
    counters, the codec states it holds, the scheduler's stats (logged) and the histogram
    observations made since the last snapshot (taken out of the pipeline's ``unexported``)."""
    eng, ts = service.engine, service.stats
    st = eng.fused_stats
    observations = []
    while st.unexported:
        observations.append(st.unexported.popleft())
    return {
        "counts": {
            "misses": st.misses,
            "codec_frames": st.codec_frames,
            "started": ts.started,
            "finished": ts.finished,
            "aborted": ts.aborted,
        },
        "live": eng.pool.live,
        "stats": eng.stats(),
        "observations": observations,
    }


class LocalTalker:
    """The tts's talker client when the engine runs in the tts's own process (pipeline fused):
    the same ``stream`` / ``abort`` as the BLS client, without a Triton hop. ``abort`` stops the
    engine request only (the stream's consumer is the caller's own task, which must not be
    cancelled).

    ``loop``: the event loop the engine runs on (a :class:`DeviceLoop`'s, one per GPU) when it is
    not the caller's: the stream then runs there, its items cross over through a queue, and a
    consumer that stops early cancels it there (which aborts the engine request)."""

    def __init__(self, service: TalkerService, loop: "asyncio.AbstractEventLoop" = None):
        self.service = service
        self.loop = loop

    def snapshot(self) -> Dict[str, Any]:
        """The lane's metrics (:func:`lane_snapshot`)."""
        return lane_snapshot(self.service)

    def stream(self, request_id: str, inputs: Mapping[str, Any]) -> AsyncIterator[np.ndarray]:
        if self.loop is None:
            return self.service.stream(request_id, inputs)
        return relay(self.loop, lambda: self.service.stream(request_id, inputs))

    async def abort(self, request_id: str) -> None:
        if self.loop is None:
            await self.service.engine.abort(request_id)
        else:  # the stream's task is the relay's, on the engine's loop: end it there, as aborted
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.service.abort(request_id), self.loop))


_RELAY_END = object()


async def relay(loop: "asyncio.AbstractEventLoop", make) -> AsyncIterator[Any]:
    """The items of the async iterator ``make()``, run as a task on ``loop`` (another thread's),
    yielded on the caller's loop, in order, then its end or its exception. When the consumer stops
    early (or is cancelled) the task on ``loop`` is cancelled, so the iterator's ``finally`` runs
    there."""
    here = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    def put(item, err=None):
        try:
            here.call_soon_threadsafe(q.put_nowait, (item, err))
        except RuntimeError:  # the consumer's loop is closed: nobody reads
            pass

    async def pump():
        try:
            async for item in make():
                put(item)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            # a cancel from ``loop``'s side (it is closing) must not look like the consumer's own
            put(_RELAY_END, RuntimeError("the engine's loop stopped") if isinstance(e, asyncio.CancelledError) else e)
            raise
        put(_RELAY_END)

    fut = asyncio.run_coroutine_threadsafe(pump(), loop)
    try:
        while True:
            item, err = await q.get()
            if item is _RELAY_END:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        if not fut.done():
            fut.cancel()  # cancels the task on ``loop``: the engine request is aborted there


class DeviceLoop:
    """An event loop on a thread of its own for one device's engine (``gpus`` > 1, pipeline
    fused). On CUDA its thread and every thread of its default executor (where the native engine
    loads and captures its graphs, and runs its steps without ``native_loop_thread``:
    ``run_in_executor(None, ...)``) make ``device`` their current device, as the engine's own loop
    thread does, so one process drives several GPUs, each engine on its own."""

    def __init__(self, device: str, name: str = "engine"):
        from concurrent.futures import ThreadPoolExecutor
        import threading

        self.device = device
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"{name}-exec", initializer=self._pin)
        )
        self.thread = threading.Thread(target=self._run, name=f"{name}-loop", daemon=True)
        self.thread.start()

    def _pin(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(self.device))

    def _run(self) -> None:
        self._pin()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout=None):
        """Run ``coro`` on this loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel what still runs on the loop, then stop it and its executor."""

        async def drain():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_default_executor()

        try:
            self.run(drain(), timeout)
        except Exception:  # noqa: BLE001 - stop regardless
            log.exception("draining the %s loop", self.device)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
