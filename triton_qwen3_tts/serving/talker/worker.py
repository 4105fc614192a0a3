"""Pipeline fused, one process per GPU: each GPU's talker engine (with its codec) runs in a
process of its own, started by the tts, and :class:`ProcessTalker` is the tts's client of it.

Why a process: the tts process runs every request's Python (admission, routing, responses), and
each engine's scheduler loop is Python too (a step, the sampling, the deadline policy, the codec
batches). With several engines in one process they take turns on one interpreter lock, so a
second GPU adds less than a second GPU's throughput (docs/benchmark-history.md, run 25). In a
process of its own each engine has an interpreter to itself, and the GPUs start at the same time.

The two sides talk over a ``multiprocessing`` pipe (pickled tuples):

* tts -> worker: ``("stream", rid, inputs)``, ``("cancel", rid)`` (the consumer stopped early: the
  stream's task is cancelled, which aborts the engine request), ``("abort", rid)`` (answered by
  ``("aborted", rid, was_live)``), ``("stop",)``;
* worker -> tts: ``("ready", info)`` or ``("failed", message)`` once, then ``("item", rid, audio)``,
  ``("end", rid, error)`` (``error`` None, or ``[CODE] field: text`` as every model of this
  repository writes its errors, re-raised by the tts with :func:`downstream_error`), and
  ``("snapshot", lane_snapshot)`` once a second (the metrics, :func:`lane_snapshot`).

The worker ends when the pipe closes (the tts process is gone) or on ``stop``. When a worker
dies, its streams end with :class:`~triton_qwen3_tts.serving.faults.PeerDied` and
:class:`WorkerWatch` reports it to the tts's watchdog, as a dead peer stub is reported.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue
import threading
import time
import traceback
from collections import deque
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional

import numpy as np

from triton_qwen3_tts.serving.errors import downstream_error, error_code_name
from triton_qwen3_tts.serving.faults import PeerDied
from triton_qwen3_tts.serving.model_config import TalkerModelConfig
from triton_qwen3_tts.serving.stub_procs import WORKER_COMM_PREFIX, Stub
from triton_qwen3_tts.serving.talker.service import lane_snapshot
from triton_qwen3_tts.serving.stub import freeze_heap

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_S = 1.0


class PipeSender:
    """Sends on one end of a ``multiprocessing`` pipe from a thread of its own, in order.

    ``conn.send`` blocks while the pipe is full (64 KiB), until the other process reads. Neither
    side's event loop may wait there: the worker's loop also turns the engine (a blocked send
    would leave the GPU idle: a 25-frame audio chunk is 192 KB, and the tts's reader thread
    gets the interpreter lock only between the tts's own work), and the tts's loop also runs the
    other workers' streams and the watchdog. :meth:`send` queues and returns at once; the queue
    is bounded by admission (each admitted stream has a few messages, or its audio, in flight)."""

    def __init__(self, conn, name: str):
        self.conn = conn
        self._outbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-send", daemon=True)
        self._thread.start()

    def send(self, msg) -> None:
        self._outbox.put(msg)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop (a send the other side never reads ends at ``timeout``)."""
        self._outbox.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            try:
                self.conn.send(msg)
            except (OSError, EOFError, BrokenPipeError, ValueError):
                pass  # the other process is gone: its reader reports it; drop the rest


# ---- the worker process --------------------------------------------------------------------------


def worker_main(conn, cfg: TalkerModelConfig, name: str, gpu: int = 0) -> None:
    """The worker process's entry point: start ``cfg``'s engine (``cfg.device``), serve one warm-up
    request (``cfg.warmup``), answer ``ready`` (or ``failed``), then serve the pipe until it closes."""
    from triton_qwen3_tts.serving.stub import prepare_process

    prepare_process()
    _name_process(f"{WORKER_COMM_PREFIX}{gpu}")
    logging.basicConfig(level=logging.INFO, format=f"{name}: %(levelname)s %(name)s: %(message)s")
    index = cuda_index(cfg.device)
    if index is not None:
        import torch

        torch.cuda.set_device(index)
        set_engine_threads(cfg.engine_cpu_threads)
    asyncio.run(_serve(conn, cfg, name))


def engine_threads(setting: int, cpus: int, gpus: int) -> int:
    """torch's CPU threads for one GPU engine's worker: the ``engine_cpu_threads`` setting, or for
    0 the ``cpus`` over the ``gpus`` (one worker each), at least 1 and at most 4. Its CPU work is
    small tensor ops between GPU calls; a team of a thread per core (torch's default) in every
    worker spins on idle cores after each op, against the loops of the other workers and the tts."""
    if setting > 0:
        return setting
    return max(1, min(4, cpus // max(1, gpus)))


def set_engine_threads(setting: int) -> int:
    """Apply :func:`engine_threads` to this process (torch's intra-op threads); returns the count."""
    import torch

    n = engine_threads(setting, len(os.sched_getaffinity(0)), torch.cuda.device_count())
    torch.set_num_threads(n)
    return n


def cuda_index(device: str) -> Optional[int]:
    """The CUDA device index ``device`` names ("cuda" alone: 0, the first visible one; the worker's
    current device must be set to an index), or None for a device that is not CUDA."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index else 0


def _name_process(comm: str) -> None:
    """Set this process's name (``/proc/self/comm``, 15 bytes at most), by which the launcher finds
    the tts's engine workers (serving/stub_procs.py ``find_workers``). Linux only; else nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, comm.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


async def _serve(conn, cfg: TalkerModelConfig, name: str) -> None:
    from triton_qwen3_tts.serving.talker.engines import make_engine, make_frontend
    from triton_qwen3_tts.serving.talker.service import TalkerService

    loop = asyncio.get_running_loop()
    sender = PipeSender(conn, name)  # never blocks this loop, which also turns the engine
    send = sender.send
    try:
        t0 = time.perf_counter()
        svc = TalkerService(make_frontend(cfg), await make_engine(cfg))
        if cfg.warmup:
            await svc.warmup()
    except BaseException as e:  # noqa: BLE001 - reported to the tts, which fails its load with it
        send(("failed", f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
        sender.close()
        return
    inbox: asyncio.Queue = asyncio.Queue()

    def reader() -> None:
        try:
            while True:
                msg = conn.recv()
                loop.call_soon_threadsafe(inbox.put_nowait, msg)
        except (EOFError, OSError):
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, ("stop",))
            except RuntimeError:  # the loop is closed already
                pass

    threading.Thread(target=reader, name=f"{name}-pipe", daemon=True).start()
    tasks: Dict[str, asyncio.Task] = {}

    async def run_stream(rid: str, inputs) -> None:
        error = None
        try:
            async for item in svc.stream(rid, inputs):
                send(("item", rid, item))
        except asyncio.CancelledError:
            error = f"[CANCELLED] request {rid} was aborted"
        except Exception as e:  # noqa: BLE001 - every error goes back to the tts, coded
            error = f"[{error_code_name(e)}] {e}"
        finally:
            tasks.pop(rid, None)
        send(("end", rid, error))

    async def run_abort(rid: str) -> None:
        try:
            was_live = await svc.abort(rid)
        except Exception:  # noqa: BLE001
            log.exception("abort of %s failed", rid)
            was_live = False
        send(("aborted", rid, was_live))

    async def snapshots() -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)
            send(("snapshot", lane_snapshot(svc)))

    freeze_heap()  # loaded and warmed up: full collections walk only what requests allocate
    send(("snapshot", lane_snapshot(svc)))  # the warm-up's counts: the tts's baseline
    send(("ready", {"device": cfg.device, "load_s": round(time.perf_counter() - t0, 1)}))
    pusher = asyncio.create_task(snapshots())
    try:
        while True:
            msg = await inbox.get()
            kind = msg[0]
            if kind == "stream":
                tasks[msg[1]] = asyncio.create_task(run_stream(msg[1], msg[2]))
            elif kind == "cancel":
                task = tasks.get(msg[1])
                if task is not None:
                    task.cancel()
            elif kind == "abort":
                asyncio.create_task(run_abort(msg[1]))
            elif kind == "stop":
                break
    finally:
        pusher.cancel()
        for task in list(tasks.values()):
            task.cancel()
        await asyncio.gather(pusher, *tasks.values(), return_exceptions=True)
        svc.engine.shutdown()
        sender.close()


# ---- the tts's side --------------------------------------------------------------------------------

_DEAD = object()  # an "end" whose error is the worker's death


class ProcessTalker:
    """The tts's talker client of one worker process: ``stream`` / ``abort`` as ``LocalTalker``'s,
    ``snapshot()`` for the metrics. ``start()`` starts the process; ``wait_ready()`` waits for its
    engine (several workers load at once); ``close()`` stops it."""

    def __init__(self, cfg: TalkerModelConfig, name: str, gpu: int = 0, target=None):
        self.cfg, self.name, self.gpu = cfg, name, gpu
        self.target = target or worker_main  # the process's entry (tests give a stand-in)
        self.process = None
        self.conn = None
        self.info: Dict[str, Any] = {}
        self.dead: Optional[str] = None  # why the worker is gone (None while it serves)
        self._closing = False
        # sends never block the tts's event loop (PipeSender): a stalled worker (stopped, or
        # stuck without reading) fills the pipe after 64 KiB, one voice-clone request's
        # reference audio is more
        self._sender: Optional[PipeSender] = None
        self._lock = threading.Lock()  # the tables below (the reader thread writes them)
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the consumers' loop (the tts's)
        self._queues: Dict[str, asyncio.Queue] = {}
        self._aborts: Dict[str, List[asyncio.Future]] = {}
        self._started = threading.Event()
        self._failure: Optional[str] = None
        self._counts: Dict[str, int] = {}
        self._live = 0
        self._stats: Dict[str, Any] = {}
        self._observations: deque = deque(maxlen=100000)  # bounded if nobody exports: the oldest go
        self._reader = None

    # -- life cycle
    def start(self) -> "ProcessTalker":
        ctx = multiprocessing.get_context("spawn")  # fork would copy the tts's threads and CUDA state
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=self.target, args=(child, self.cfg, self.name, self.gpu), name=self.name, daemon=True
        )
        self.process.start()
        child.close()
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-pipe", daemon=True)
        self._reader.start()
        self._sender = PipeSender(self.conn, self.name)
        return self

    def wait_ready(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Block until the worker's engine is ready (and warmed up); RuntimeError with the worker's
        own message when it failed or died first."""
        if not self._started.wait(timeout):
            raise RuntimeError(f"{self.name}: engine not ready after {timeout:g} s")
        if self._failure is not None:
            raise RuntimeError(self._failure)
        return self.info

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker (its engine shuts down), killing it when it does not end in ``timeout``."""
        self._closing = True
        if self.process is None:
            return
        self._send(("stop",))
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        if self._sender is not None:
            self._sender.close()  # after the kill, a send it was blocked in fails
        self.conn.close()

    # -- the client interface (serving/tts/service.py TalkerClient)
    async def stream(self, request_id: str, inputs: Mapping[str, Any]) -> AsyncIterator[np.ndarray]:
        q: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            if self.dead is not None:
                raise PeerDied(self.dead)
            self._queues[request_id] = q
        finished = False
        try:
            self._send(("stream", request_id, dict(inputs)))  # a send that fails: the reader ends q
            while True:
                msg = await q.get()
                if msg[0] == "item":
                    yield msg[2]
                    continue
                finished = True
                error = msg[2]
                if error is _DEAD:
                    raise PeerDied(self.dead)
                if error is not None:
                    raise downstream_error(self.name, error)
                return
        finally:
            with self._lock:
                self._queues.pop(request_id, None)
            if not finished and self.dead is None:
                self._send(("cancel", request_id))

    async def abort(self, request_id: str) -> None:
        """Abort the engine request and wait until the worker has (its stream then ends)."""
        fut = asyncio.get_running_loop().create_future()
        with self._lock:
            self._loop = asyncio.get_running_loop()  # where the reader resolves ``fut``
            if self.dead is not None:
                return
            self._aborts.setdefault(request_id, []).append(fut)
        self._send(("abort", request_id))
        await fut

    def snapshot(self) -> Dict[str, Any]:
        """The latest of the worker's counters and stats, and the observations since the last call."""
        with self._lock:
            observations = list(self._observations)
            self._observations.clear()
            return {
                "counts": dict(self._counts),
                "live": self._live,
                "stats": dict(self._stats),
                "observations": observations,
            }

    # -- internals
    def _send(self, msg) -> None:
        """Queue ``msg`` for the worker; never blocks. A message the worker never gets (it died)
        needs no answer of its own: the reader sees the pipe close and ends every stream and
        abort with :class:`PeerDied`."""
        self._sender.send(msg)

    def _post(self, fn, *args) -> None:
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the tts's loop is closed: nobody waits
                pass

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                kind = msg[0]
                if kind in ("item", "end"):
                    with self._lock:
                        q = self._queues.get(msg[1])
                    if q is not None:
                        self._post(q.put_nowait, msg)
                elif kind == "aborted":
                    with self._lock:
                        futs = self._aborts.pop(msg[1], [])
                    for fut in futs:
                        self._post(_resolve, fut)
                elif kind == "snapshot":
                    snap = msg[1]
                    with self._lock:
                        self._counts, self._live, self._stats = snap["counts"], snap["live"], snap["stats"]
                        self._observations.extend(snap["observations"])
                elif kind == "ready":
                    self.info = msg[1]
                    self._started.set()
                elif kind == "failed":
                    self._failure = msg[1]
                    self._started.set()
        except (EOFError, OSError):
            pass
        pid = self.process.pid if self.process is not None else None
        why = f"{self.name}: its engine process (pid {pid}) {'stopped' if self._closing else 'died'}"
        with self._lock:
            self.dead = why
            queues, aborts = list(self._queues.items()), list(self._aborts.values())
            self._aborts.clear()
        if not self._started.is_set():
            self._failure = self._failure or f"{why} before its engine was ready"
            self._started.set()
        for rid, q in queues:
            self._post(q.put_nowait, ("end", rid, _DEAD))
        for futs in aborts:
            for fut in futs:
                self._post(_resolve, fut)


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def start_workers(cfgs: List[TalkerModelConfig], names: List[str]) -> List[ProcessTalker]:
    """Start one worker per config at once and wait until every engine is ready; when one fails,
    stop them all and raise its message."""
    workers = [ProcessTalker(cfg, name, gpu).start() for gpu, (cfg, name) in enumerate(zip(cfgs, names))]
    try:
        for w in workers:
            w.wait_ready()
    except BaseException:
        for w in workers:
            w.close(timeout=5)
        raise
    return workers


class WorkerWatch:
    """The tts watchdog's ``peers`` (``poll()`` -> the processes that died since the last poll) for
    the worker processes, so a dead engine fails every request UNAVAILABLE at once, as a dead peer
    stub does (serving/tts/service.py ``check``)."""

    def __init__(self, workers: List[ProcessTalker], model: str = "tts"):
        self.workers = list(workers)
        self.model = model
        self._reported: set = set()

    def poll(self) -> List[Stub]:
        dead = []
        for w in self.workers:
            if w.dead is not None and not w._closing and w.name not in self._reported:
                self._reported.add(w.name)
                pid = w.process.pid if w.process is not None else -1
                dead.append(Stub(pid=pid, model=self.model, instance=w.name, parent_pid=-1))
        return dead
