"""One pipeline per GPU: which device serves a new stream, and how many may run (pure; no Triton).

With ``gpus N`` the tts serves through N self-contained pipelines (*lanes*), one per device: a
talker engine and its codec (pipeline fused: one engine with the codec in its loop). A stream is
served by one lane from its first frame to its FINAL, so its talker request and codec state stay
on that device. :class:`Router` picks the lane of each new stream and keeps the counts:

* a new stream goes to the least-loaded lane (fewest streams in flight; ties: the next lane in
  turn after the last one given a stream, so that equal lanes take turns) among those under
  their limit (``per_device``, the ``max_in_flight`` setting) while the total is under ``total``
  (default ``devices x per_device``);
* when none can take it, up to ``max_queued`` more wait (one queue for all lanes, first come first
  served); a freed slot goes to the head of the queue, on the least-loaded lane that then has room;
* beyond that a stream is refused at once with :class:`Overloaded` (Triton ``UNAVAILABLE``);
* :meth:`Router.release` gives a stream's slot back (the service calls it once per admitted
  stream: on its FINAL, on error, on cancel). A waiter that is cancelled leaves the queue, and if a
  slot had just been handed to it, passes that slot on.

With one device it behaves as :class:`~triton_qwen3_tts.serving.tts.admission.Admission`.

:func:`resolve_devices` turns the ``gpus`` setting (``N`` or ``all``) into the lanes' devices at
load time, and :func:`lane_model_names` names the per-device models of the split pipeline
(``talker_0``, ``talker_1``, ...).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, List, Optional

from triton_qwen3_tts.serving.tts.admission import Overloaded

__all__ = ["Router", "Overloaded", "DeviceError", "parse_gpus", "resolve_devices", "lane_model_names"]


class DeviceError(ValueError):
    """The ``gpus`` setting cannot be served on this machine (fails the model load)."""


class Router:
    """Lane choice and admission for ``devices`` lanes. Must be used from one event loop.

    ``on_change(device, in_flight_of_device)`` is called after every change of a lane's count
    (the adapter's per-GPU in-flight gauge)."""

    def __init__(
        self,
        devices: int,
        per_device: int,
        max_queued: int,
        total: Optional[int] = None,
        on_change: Callable[[int, int], None] = lambda device, n: None,
    ):
        if not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be an int >= 1, got {devices!r}")
        if not isinstance(per_device, int) or per_device < 1:
            raise ValueError(f"per_device (max_in_flight) must be an int >= 1, got {per_device!r}")
        if not isinstance(max_queued, int) or max_queued < 0:
            raise ValueError(f"max_queued must be an int >= 0, got {max_queued!r}")
        total = devices * per_device if total is None else total
        if not isinstance(total, int) or total < 1:
            raise ValueError(f"total must be an int >= 1, got {total!r}")
        self.devices = devices
        self.per_device = per_device
        self.max_queued = max_queued
        self.total = total
        self.load: List[int] = [0] * devices  # streams in flight per lane
        self.routed: List[int] = [0] * devices  # streams ever admitted per lane
        self.refused = 0
        self.on_change = on_change
        # the lane after the one last given a stream: ties go round, not always to lane 0, which
        # would then take every stream that arrives while the lanes are level (the common case at
        # a low in-flight count) and carry a measurably larger share of the new streams' first
        # chunks, the most urgent work
        self._turn = 0
        self._waiters: "collections.deque[asyncio.Future]" = collections.deque()

    @property
    def in_flight(self) -> int:
        return sum(self.load)

    @property
    def queued(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    def choose(self) -> Optional[int]:
        """The lane a new stream would get now: the least loaded under its limit (ties: the first in
        turn, counting from the lane after the one last given a stream), or None when every lane is
        full or the total limit is reached."""
        if self.in_flight >= self.total:
            return None
        best = None
        for i in range(self.devices):
            d = (self._turn + i) % self.devices
            n = self.load[d]
            if n < self.per_device and (best is None or n < self.load[best]):
                best = d
        return best

    def _take(self, device: int) -> int:
        self.load[device] += 1
        self.routed[device] += 1
        self._turn = (device + 1) % self.devices
        self.on_change(device, self.load[device])
        return device

    async def acquire(self) -> int:
        """Admit one stream; returns its lane. Waits in the queue when every lane is full, raises
        :class:`Overloaded` when the queue is full too."""
        d = None if self._waiters else self.choose()
        if d is not None:
            return self._take(d)
        if len(self._waiters) >= self.max_queued:
            self.refused += 1
            raise Overloaded(
                f"server busy: {self.in_flight} requests in flight (limit {self.per_device} per GPU on "
                f"{self.devices} GPU(s), {self.total} in all: {self.load}) and {len(self._waiters)} "
                f"waiting (limit {self.max_queued}); retry later"
            )
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await fut  # release() hands a lane over by resolving the future with it
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # handed over just as we were cancelled: pass it on
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self, device: int) -> None:
        """Give back the slot of a stream served on ``device``; wake queued streams that now fit."""
        if not 0 <= device < self.devices or self.load[device] <= 0:
            raise ValueError(f"release({device}) without an acquire on that device (load {self.load})")
        self.load[device] -= 1
        self.on_change(device, self.load[device])
        while self._waiters:
            d = self.choose()
            if d is None:
                return
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(self._take(d))


def parse_gpus(value) -> Optional[int]:
    """The ``gpus`` setting: a count >= 1, or None for ``all``. Raises :class:`DeviceError`."""
    text = str(value).strip().lower()
    if text == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1 or text != str(n):
        raise DeviceError(f"gpus: must be a number of GPUs >= 1 or 'all'; got {value!r}")
    return n


def resolve_devices(value, device: str, cuda_count: int) -> List[str]:
    """The lanes' torch devices for the ``gpus`` setting ``value`` on ``device`` (``cuda`` or
    ``cpu``), given ``cuda_count`` visible CUDA GPUs (``torch.cuda.device_count()``).

    On ``cuda``: ``cuda:0`` .. ``cuda:N-1`` (``all``: every visible GPU). On ``cpu`` N lanes share
    the host (each its own engine; how the CPU tests simulate N GPUs); ``all`` needs a GPU."""
    n = parse_gpus(value)
    if device == "cpu":
        if n is None:
            raise DeviceError("gpus: 'all' counts CUDA GPUs, and this repository runs on cpu; give a number")
        return ["cpu"] * n
    if device != "cuda" and not device.startswith("cuda:"):
        raise DeviceError(f"device must be cuda or cpu, got {device!r}")
    if cuda_count < 1:
        raise DeviceError(f"gpus: {value}: no CUDA GPU is visible (CUDA_VISIBLE_DEVICES, the driver)")
    if n is None:
        n = cuda_count
    if n > cuda_count:
        raise DeviceError(f"gpus: {n} GPUs asked for, but only {cuda_count} visible to this process")
    return [f"cuda:{i}" for i in range(n)]


def lane_model_names(base: str, devices: int) -> List[str]:
    """The split pipeline's per-device model names: ``base`` alone for one device, else
    ``base_0`` .. ``base_{N-1}``."""
    return [base] if devices == 1 else [f"{base}_{i}" for i in range(devices)]


def visible_gpu(index: int, cuda_visible_devices: Optional[str]) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows only the ``index``-th GPU of those the server
    sees (``cuda_visible_devices``: the server's value, None when unset: every GPU by index)."""
    if cuda_visible_devices is None:
        return str(index)
    ids = [x.strip() for x in cuda_visible_devices.split(",") if x.strip()]
    if not 0 <= index < len(ids):
        raise DeviceError(f"gpu {index}: CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} shows {len(ids)} GPU(s)")
    return ids[index]
