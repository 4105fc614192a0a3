"""GPU time per kind of work in the engine's loop, from CUDA event pairs around each launch.

The loop launches its work without waiting for it (decode steps, prefills, the fused pipeline's
codec calls), so host clocks measure queueing, not work. A :class:`GpuTimer` records a timing
event before and after each launch, keeps the pair until the end event has completed (checked
without blocking, ``Event.query``, whenever the loop has waited for the GPU anyway) and then adds
``start.elapsed_time(end)`` to its kind's total. The totals, per kind (``step_b64``,
``prefill``, ``codec_first``, ...), go into the engine's ``stats()`` and the server's periodic
log line, and tell where the GPU's time goes under load: which share is talker steps, prefills
and codec calls, and what each costs on average.

A pair measures from the moment the GPU reaches the start event to the moment it reaches the
end event: the work between them, plus any time the GPU sat idle inside that span waiting for
the host to launch the rest (a launch the host enqueues in several pieces, such as a prefill's
input copies and its graph). With the loop's work queued ahead of the GPU that gap is rare;
under no load it is counted.

The time between pairs is where the GPU had nothing of the loop's to run. Each collected pair's
start is measured against the previous pair's end (the loop launches everything on one stream,
so they run in launch order) and the gap added under the transition between their kinds
(``step>codec``, ``codec>step``, ``step>step``, ``prefill>step``, ...: :func:`kind_group`);
gaps of at least :data:`IDLE_GAP_MS` go to ``idle`` (no work queued, not a bubble between
launches). ``gap_snapshot`` in the engine's ``stats()["gpu_gap_ms"]``; ``scripts/gpu_busy.py``
prints them per loop iteration, which names the host work the GPU waited for.

On a CPU device the engine passes :class:`HostEvent` (the work is done when its call returns,
so the host's clock at each record measures it). With ``enabled`` False every call is a no-op.
``event`` is the event factory (tests pass a fake one).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Deque, Dict, Optional, Tuple

MAX_OPEN = 4096  # pairs kept while their end event is pending (bounded if nobody collects)
IDLE_GAP_MS = 50.0  # a gap between two launches at least this long: the loop had no work


def kind_group(kind: str) -> str:
    """``step_b64`` -> ``step``, ``codec_first`` -> ``codec``; other kinds as they are."""
    return "step" if kind.startswith("step") else "codec" if kind.startswith("codec") else kind


class HostEvent:
    """A timing event for work done synchronously on the host (a CPU device): the host clock
    at :meth:`record`; always complete. The methods of ``torch.cuda.Event`` used here."""

    t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.t - self.t) * 1000.0


def _cuda_event():
    import torch

    return torch.cuda.Event(enable_timing=True)


class GpuTimer:
    def __init__(self, enabled: bool, event: Optional[Callable[[], object]] = None):
        self.enabled = enabled
        self._event = event or _cuda_event
        self._open: Deque[Tuple[str, object, object]] = deque()
        self.ms: Dict[str, float] = {}
        self.calls: Dict[str, int] = {}
        self.dropped = 0  # pairs dropped because too many were pending
        self.gap_ms: Dict[str, float] = {}  # "step>codec": the GPU's ms between such launches
        self.gap_calls: Dict[str, int] = {}
        self._prev: Optional[Tuple[str, object]] = None  # the last collected pair's kind, end

    def start(self):
        """Record a start event on the current stream (None when disabled)."""
        if not self.enabled:
            return None
        ev = self._event()
        ev.record()
        return ev

    def stop(self, kind: str, start) -> object:
        """Record the end event of ``kind``'s launch begun at ``start`` (from :meth:`start`);
        returns it (a timing event, usable to wait for the launch) or None when disabled."""
        if start is None:
            return None
        end = self._event()
        end.record()
        if len(self._open) >= MAX_OPEN:
            self._open.popleft()
            self.dropped += 1
            self._prev = None  # the next pair's gap would span the dropped one
        self._open.append((kind, start, end))
        return end

    def collect(self) -> None:
        """Add the pairs whose end event has completed, oldest first (never waits)."""
        while self._open and self._open[0][2].query():
            kind, start, end = self._open.popleft()
            self.ms[kind] = self.ms.get(kind, 0.0) + float(start.elapsed_time(end))
            self.calls[kind] = self.calls.get(kind, 0) + 1
            if self._prev is not None:
                prev_kind, prev_end = self._prev
                gap = max(0.0, float(prev_end.elapsed_time(start)))
                key = "idle" if gap >= IDLE_GAP_MS else f"{kind_group(prev_kind)}>{kind_group(kind)}"
                self.gap_ms[key] = self.gap_ms.get(key, 0.0) + gap
                self.gap_calls[key] = self.gap_calls.get(key, 0) + 1
            self._prev = (kind, end)

    def snapshot(self) -> Dict[str, dict]:
        """``{kind: {"ms": total, "calls": n, "mean_ms": total / n}}`` of the collected pairs."""
        ms, calls = dict(self.ms), dict(self.calls)  # dict copies are atomic under the GIL
        return {
            k: {"ms": round(v, 1), "calls": calls.get(k, 0), "mean_ms": round(v / max(1, calls.get(k, 0)), 3)}
            for k, v in sorted(ms.items())
        }

    def gap_snapshot(self) -> Dict[str, dict]:
        """``{transition: {"ms": total, "calls": n}}`` of the gaps between collected pairs."""
        ms, calls = dict(self.gap_ms), dict(self.gap_calls)
        return {k: {"ms": round(v, 1), "calls": calls.get(k, 0)} for k, v in sorted(ms.items())}


class LoopClock:
    """Host wall time of the engine loop's phases, the host-side twin of :class:`GpuTimer`.

    The loop calls :meth:`lap` at the end of each phase of an iteration (releases, admissions,
    the co-worker's launch, the step's launch, reading frames, handing them over, idling), so
    the laps partition the loop thread's wall time. :meth:`wait` times a wait for the GPU
    (``event.synchronize()``) under its own name; a wait is also part of the lap it happens
    in. Where the GPU is not busy all the time (``scripts/gpu_busy.py``), the laps say which
    host work it waited for: with the loop's waits near zero the host, not the GPU, bounds the
    iteration rate. Written by the loop's thread only; :meth:`snapshot` may run on any."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._t: Optional[float] = None
        self.ms: Dict[str, float] = {}
        self.calls: Dict[str, int] = {}

    def _add(self, name: str, seconds: float) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + seconds * 1000.0
        self.calls[name] = self.calls.get(name, 0) + 1

    def lap(self, name: str) -> None:
        """The time since the previous lap (none before the first) goes to ``name``."""
        now = self._clock()
        if self._t is not None:
            self._add(name, now - self._t)
        self._t = now

    def wait(self, name: str, event) -> None:
        """``event.synchronize()``, its duration added to ``name``."""
        t0 = self._clock()
        event.synchronize()
        self._add(name, self._clock() - t0)

    def snapshot(self) -> Dict[str, dict]:
        """``{name: {"ms": total, "calls": n}}``."""
        ms, calls = dict(self.ms), dict(self.calls)  # dict copies are atomic under the GIL
        return {k: {"ms": round(v, 1), "calls": calls.get(k, 0)} for k, v in sorted(ms.items())}
