"""The tts's per-request codec sessions (the client side of a codec model).

On the tts side, a request opens a *codec session* (``codec.session()``) with
``async decode(codes, left_context)`` and ``close()`` (or ``async aclose()``): :class:`WindowedSession`
forwards to the windowed codec; :class:`StatefulSession` keeps the stream's state between chunks
and drops it on ``close()``; :class:`ResidentSession` sends only frames and a stream id and releases
the codec's copy on ``aclose()`` (both called in a ``finally`` on end, error and cancel).
:class:`LiveCounter` counts the sessions holding state (the ``qwen3_tts_codec_states_live`` gauge).
"""

from __future__ import annotations

import threading
from typing import Any, Awaitable, Callable, Optional, Tuple

import numpy as np

from triton_qwen3_tts.serving.codec.stateful import new_stream_id


class LiveCounter:
    """Thread-safe count of live codec states; ``on_change(n)`` after every change (gauge hook)."""

    def __init__(self, on_change: Callable[[int], None] = lambda n: None):
        self._n = 0
        self._lock = threading.Lock()
        self.on_change = on_change

    @property
    def value(self) -> int:
        return self._n

    def add(self, d: int) -> None:
        with self._lock:
            self._n += d
            n = self._n
        self.on_change(n)


class WindowedSession:
    """Forwards to a windowed codec client (``decode(window, left_context)``); holds no state."""

    stateful = False

    def __init__(self, client):
        self.client = client

    async def decode(self, codes: np.ndarray, left_context: int) -> np.ndarray:
        return await self.client.decode(codes, left_context)

    def close(self) -> None:
        pass


# call(new_codes [T, 16], state or None) -> (audio [T * spf], new state); state is opaque here.
StepCall = Callable[[np.ndarray, Optional[Any]], Awaitable[Tuple[np.ndarray, Any]]]


class StatefulSession:
    """One stream's codec state between chunks. ``decode`` sends only the new frames
    (``codes[left_context:]``: with the stateful schedule ``left_context`` is 0) and keeps the
    returned state for the next chunk. ``close()`` drops the state (idempotent)."""

    stateful = True

    def __init__(self, call: StepCall, counter: Optional[LiveCounter] = None):
        self.call = call
        self.counter = counter
        self.state: Optional[Any] = None
        self.frames = 0
        self.closed = False
        self._counted = False

    async def decode(self, codes: np.ndarray, left_context: int) -> np.ndarray:
        new = _new_frames(self, codes, left_context)
        if new.shape[0] == 0:
            return np.zeros(0, np.float32)
        if not self._counted and self.counter is not None:
            self._counted = True
            self.counter.add(1)
        audio, state = await self.call(new, self.state)
        if self.closed:  # closed while the call was in flight: do not resurrect the state
            return audio
        self.state = state
        self.frames += new.shape[0]
        return audio

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.state = None
        if self._counted and self.counter is not None:
            self.counter.add(-1)


def open_session(codec):
    """``codec.session()`` when the client has one, else a :class:`WindowedSession` around it."""
    make = getattr(codec, "session", None)
    return make() if callable(make) else WindowedSession(codec)


def _new_frames(session, codes: np.ndarray, left_context: int) -> np.ndarray:
    """A stateful session's new frames: ``codes[left_context:]`` (with the stateful schedule the
    left context is 0; any context frames were decoded before and live in the state)."""
    if session.closed:
        raise RuntimeError("codec session is closed")
    return np.asarray(codes)[left_context:]


# step(new_codes [T, 16], stream_id, start) -> audio [T * spf]; release(stream_id) -> None
ResidentStep = Callable[[np.ndarray, int, bool], Awaitable[np.ndarray]]
ResidentRelease = Callable[[int], Awaitable[None]]


class ResidentSession:
    """One stream on a resident-state codec: ``decode`` sends only the new frames and the stream
    id (``start`` on the first call); ``aclose()`` sends the release (``end``) once a call has been
    made, whatever happened since: the codec frees the slot, or finds it already gone."""

    stateful = True

    def __init__(self, step: ResidentStep, release: ResidentRelease, stream_id: Optional[int] = None):
        self.step = step
        self.release = release
        self.stream_id = new_stream_id() if stream_id is None else int(stream_id)
        self.frames = 0
        self.opened = False
        self.closed = False

    async def decode(self, codes: np.ndarray, left_context: int) -> np.ndarray:
        new = _new_frames(self, codes, left_context)
        if new.shape[0] == 0:
            return np.zeros(0, np.float32)
        start = not self.opened
        self.opened = True  # from here on the codec may hold state: aclose() must release it
        audio = await self.step(new, self.stream_id, start)
        self.frames += new.shape[0]
        return audio

    async def aclose(self) -> None:
        """Release the codec's state; one retry (a lost release holds a slot until the codec's
        idle timeout), then the error goes to the caller (the service logs it)."""
        if self.closed:
            return
        self.closed = True
        if self.opened:
            try:
                await self.release(self.stream_id)
            except Exception:  # noqa: BLE001 - retried once below
                await self.release(self.stream_id)

    def close(self) -> None:  # sync callers: nothing to release if no call was made
        if self.opened and not self.closed:
            raise RuntimeError("a resident codec session that was used must be closed with aclose()")
        self.closed = True
