"""Admission control for the `tts` model (pure asyncio; no Triton).

At most ``max_in_flight`` requests run at once. Up to ``max_queued`` more wait, first come first
served. Beyond that a request is refused at once with :class:`Overloaded` (the adapter maps it to
Triton ``UNAVAILABLE``), so a burst never piles up unbounded work or memory, and the requests that
were admitted keep their latency.

A waiter that is cancelled (client gone) leaves the queue without taking a slot.
"""

from __future__ import annotations

import asyncio
import collections
from contextlib import asynccontextmanager
from dataclasses import dataclass

from triton_qwen3_tts.serving.faults import Unavailable


class Overloaded(Unavailable):
    """The server is at its admission limit and the wait queue is full."""


@dataclass(frozen=True)
class AdmissionConfig:
    max_in_flight: int = 64
    max_queued: int = 64

    def __post_init__(self):
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {self.max_in_flight!r}")
        if not isinstance(self.max_queued, int) or self.max_queued < 0:
            raise ValueError(f"max_queued must be an int >= 0, got {self.max_queued!r}")


class Admission:
    """Must be used from one event loop."""

    def __init__(self, config: AdmissionConfig):
        self.config = config
        self.in_flight = 0
        self._waiters: "collections.deque[asyncio.Future]" = collections.deque()
        self.refused = 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        if self.in_flight < self.config.max_in_flight and not self._waiters:
            self.in_flight += 1
            return
        if len(self._waiters) >= self.config.max_queued:
            self.refused += 1
            raise Overloaded(
                f"server busy: {self.in_flight} requests in flight (limit {self.config.max_in_flight}) "
                f"and {len(self._waiters)} waiting (limit {self.config.max_queued}); retry later"
            )
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # release() hands its slot over by resolving the future
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # The slot was handed to us just as we were cancelled: pass it on.
                self.release()
            else:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # slot handed over; in_flight unchanged
                return
        self.in_flight -= 1
        assert self.in_flight >= 0, "release() without acquire()"

    @asynccontextmanager
    async def slot(self):
        await self.acquire()
        try:
            yield
        finally:
            self.release()
