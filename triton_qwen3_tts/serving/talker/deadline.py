"""The fused pipeline's choice, each scheduler iteration: a talker step, or which codec batch.

Pure logic (no torch, no Triton), driven by :mod:`triton_qwen3_tts.serving.talker.fused` and
unit-tested with a fake clock (tests/test_deadline.py).

Every stream has a **playback deadline**. Its client starts playing when the first chunk arrives
and plays at real time (24 kHz, 80 ms per frame), so at time ``now`` its buffer holds::

    slack = t_first_chunk + delivered_frames * 0.08 - now      (seconds; < 0: an underrun)

:meth:`DeadlinePolicy.pick` looks at the frames each stream has generated but not yet decoded
(``pending``) and answers with a :class:`CodecBatch` (decode ``frames`` frames of each listed
stream, in one call) or None (run a talker step, or nothing when the talker is idle too):

1. **First chunks first.** A stream that has sent nothing and has its first chunk's frames
   (``first_chunk_frames``; fewer when the talker is done with it) is decoded before anything else.
2. After that a stream is **ready** when its next chunk is pending: the chunk schedule's size
   (``ramp``, then ``chunk_frames``: small chunks while its buffer is short, larger later), or
   whatever is left once the talker is done with it. Chunks never shrink below the schedule: a
   stream that falls behind decodes full chunks late rather than many tiny ones, each of which
   costs a whole codec call (the small-chunk spiral that halves throughput under load).
3. **Critical.** A ready stream whose slack is below ``urgent_s`` is decoded now.
4. **Due.** A ready stream whose slack is below ``buffer_s``, or whose talker is done (its request
   ends only when its last audio is out), is decoded, but never twice in a row without a talker
   step between, so decoding ahead never starves generation. While a new stream waits for its
   first frames, critical decodes alternate with talker steps too.
5. **Idle talker.** When no talker step is pending anyway, everything pending is decoded.

A stream whose buffer is full (slack at least ``buffer_s``) waits: its frames pile up and go out
later in one larger chunk, or as a ride-along (below), or **ahead** (``ahead_batch`` > 0): while
the talker runs and at least ``ahead_batch`` such streams have a whole ``chunk_frames`` chunk
pending, they are decoded together, after everything more urgent and never twice in a row
without a talker step between. Streams far ahead of playback (a closed loop's) otherwise keep
most of their frames until their talker is done, and the request ends only after the last of
them is decoded; ahead calls decode them earlier in the codec's fullest calls instead.

A decode takes at most ``chunk_frames`` frames per stream, rounded down to one of
``frame_buckets`` (the codec's CUDA-graph sizes; the rest stays pending). The batch is the most
urgent stream's group: the candidates that decode the same number of frames, most urgent first,
then (filling the batch) **ride-alongs**, least slack first; at most ``max_batch``. Which streams
may ride along (``ride_along``):

* ``schedule``: a stream with at least the batch's frames pending whose schedule's next chunk is
  no larger than that (it would be decoded in a call of its own soon anyway);
* ``due``: those, and any other stream with at least the batch's frames pending whose buffer is
  below target (slack under ``buffer_s``), if the batch's frames are at least half its
  schedule's next chunk: it gets a smaller chunk than its schedule's, in a call that runs anyway,
  instead of a call of its own later. Fewer, fuller codec calls (each costs a few ms however few
  streams it has), at the price of more chunks, none below half their scheduled size (a stream
  finishing with one frame left does not take every other stream's next frame along).

**A finished stream's last chunks** (``finish``, one of ``FINISH``). Its request ends only after
its last audio, and a closed-loop client's next request waits for that end, while the talker row
it held is already free. With ``split`` its rest is rounded down like any chunk, so it may take
several calls (15 frames: 8, 4, 2, 1), each after a talker step, and it ranks with the due
streams by slack, behind every stream still in its ramp (its own slack is large): under load its
frames pile up behind theirs. ``pad``: its rest (up to ``chunk_frames``) goes in one call of the
smallest frame bucket that holds it; the pipeline pads its codes to that size and drops the
padding's audio (the codec is causal: a frame's audio never depends on later frames; the
stream's state is released after its last chunk; so the audio is the same), and a finished
stream with fewer frames pending than a batch's rides along in it, padded. ``pad_first``: that,
and finished streams rank before the due ones (still after first chunks and critical streams, so
no listener's buffer pays for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Tuple

FRAME_SECONDS = 1920 / 24000  # one frame = 80 ms of audio
RIDE_ALONG = ("schedule", "due")
FINISH = ("split", "pad", "pad_first")


@dataclass
class StreamState:
    """What the policy knows of one stream (the fused pipeline updates it)."""

    sid: int
    t_submit: float
    pending: int = 0  # frames generated, not decoded
    talker_done: bool = False  # the talker will send no more frames
    delivered: int = 0  # frames decoded and handed out
    chunks: int = 0  # audio chunks handed out
    t_first: Optional[float] = None  # when the first chunk was handed out (playback starts)
    t_ready: Optional[float] = None  # when it first became a decode candidate (scheduling lag)

    def slack(self, now: float) -> Optional[float]:
        """Seconds of audio the client holds ahead of playback (None before the first chunk)."""
        if self.t_first is None:
            return None
        return self.t_first + self.delivered * FRAME_SECONDS - now

    @property
    def finished(self) -> bool:
        return self.talker_done and self.pending == 0


@dataclass(frozen=True)
class CodecBatch:
    frames: int  # new frames per stream (the same for all: one codec call)
    sids: Tuple[int, ...]
    reason: str  # "first" | "critical" | "due" | "done" | "ahead" | "idle" (of the most urgent stream)


@dataclass
class DeadlinePolicy:
    first_chunk_frames: int = 1
    ramp: Tuple[int, ...] = (4, 8, 16)
    chunk_frames: int = 50
    buffer_s: float = 0.4
    urgent_s: float = 0.15
    max_batch: int = 64
    frame_buckets: Tuple[int, ...] = ()  # () = any frame count
    ride_along: str = "schedule"  # one of RIDE_ALONG (module docstring)
    finish: str = "split"  # one of FINISH: a finished stream's last chunks (module docstring)
    ahead_batch: int = 0  # full buffers decoded ahead once this many have a whole chunk (0: never)
    _last_was_codec: bool = field(default=False, repr=False)

    def __post_init__(self):
        for name in ("first_chunk_frames", "chunk_frames", "max_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.first_chunk_frames > self.chunk_frames:
            raise ValueError(f"first_chunk_frames ({self.first_chunk_frames}) must be <= chunk_frames")
        if not 0 <= self.urgent_s <= self.buffer_s:
            raise ValueError(f"need 0 <= urgent_s <= buffer_s, got {self.urgent_s}, {self.buffer_s}")
        if self.ride_along not in RIDE_ALONG:
            raise ValueError(f"ride_along must be one of {', '.join(RIDE_ALONG)}, got {self.ride_along!r}")
        if self.finish not in FINISH:
            raise ValueError(f"finish must be one of {', '.join(FINISH)}, got {self.finish!r}")
        if isinstance(self.ahead_batch, bool) or not isinstance(self.ahead_batch, int) or self.ahead_batch < 0:
            raise ValueError(f"ahead_batch must be an int >= 0, got {self.ahead_batch!r}")
        fb = tuple(sorted(set(int(b) for b in self.frame_buckets)))
        if fb and fb[0] != 1:
            raise ValueError(f"frame_buckets must contain 1 (every pending count can then be decoded), got {fb}")
        self.frame_buckets = fb

    # -- sizes ---------------------------------------------------------------------------------
    def chunk_size(self, k: int) -> int:
        """The k-th chunk's target size (0: the first chunk)."""
        if k == 0:
            return self.first_chunk_frames
        if k - 1 < len(self.ramp):
            return min(self.ramp[k - 1], self.chunk_frames)
        return self.chunk_frames

    def fit(self, n: int) -> int:
        """``n`` frames rounded down to a frame bucket, at most ``chunk_frames`` (0 for n < 1)."""
        n = min(n, self.chunk_frames)
        if n < 1:
            return 0
        if not self.frame_buckets:
            return n
        return max(b for b in self.frame_buckets if b <= n)

    def fit_up(self, n: int) -> int:
        """The smallest frame bucket that holds ``n`` frames (``n`` without buckets); above
        ``chunk_frames`` (or the largest bucket): :meth:`fit`'s size, the rest decoded later."""
        if n < 1:
            return 0
        if n >= self.chunk_frames:
            return self.fit(n)
        if not self.frame_buckets:
            return n
        return min((b for b in self.frame_buckets if b >= n), default=self.fit(n))

    @property
    def pad(self) -> bool:
        """A finished stream's rest goes in one padded call (``finish`` pad or pad_first)."""
        return self.finish != "split"

    def final_frames(self, s: StreamState) -> int:
        """Frames of the next call for a stream whose talker is done: its rest rounded up to a
        bucket when :attr:`pad` (the pipeline pads the codes), else rounded down."""
        return self.fit_up(s.pending) if self.pad else self.fit(s.pending)

    # -- the choice ------------------------------------------------------------------------------
    def candidates(self, streams: Iterable[StreamState], now: float, talker_busy: bool):
        """``(key, reason, frames, stream)`` of every stream that may be decoded now; a lower key
        is more urgent: first chunks, critical, then (``finish`` pad_first) finished streams,
        then finished and due ones by slack, then full buffers with a whole chunk pending
        (``ahead_batch``, talker busy) or idle flushes (talker idle)."""
        out = []
        done_rank = 1 if self.finish == "pad_first" else 2  # within group 2; due streams: 2
        for s in streams:
            if s.pending < 1:
                continue
            if s.chunks == 0:
                if s.pending >= self.first_chunk_frames or s.talker_done:
                    out.append(((0, 0, s.t_submit), "first", self.fit(min(s.pending, self.first_chunk_frames)), s))
                continue
            slack = s.slack(now)
            # ready: its next chunk (the ramp's size) is pending, or the talker is done with it
            ready = s.pending >= self.fit(self.chunk_size(s.chunks)) or s.talker_done
            frames = self.final_frames(s) if s.talker_done else self.fit(s.pending)  # every branch's
            if ready and slack < self.urgent_s:
                out.append(((1, 0, slack), "critical", frames, s))
            elif s.talker_done:
                out.append(((2, done_rank, slack), "done", frames, s))
            elif ready and slack < self.buffer_s:
                out.append(((2, 2, slack), "due", frames, s))
            elif self.ahead_batch and talker_busy and s.pending >= self.chunk_frames:
                out.append(((3, 0, slack), "ahead", frames, s))
            elif not talker_busy:
                out.append(((3, 0, slack), "idle", frames, s))
        out.sort(key=lambda c: c[0])
        return out

    def _rides_along(self, s: StreamState, frames: int, now: float) -> bool:
        """May ``s`` join a batch of ``frames`` frames per stream (``ride_along``)?"""
        if s.t_first is None:
            return False
        if self.pad and s.talker_done and 1 <= s.pending <= frames:
            return True  # its rest, padded, in a call that runs anyway
        if self.fit(s.pending) < frames:
            return False
        scheduled = self.fit(self.chunk_size(s.chunks))
        if frames >= scheduled:
            return True
        return self.ride_along == "due" and 2 * frames >= scheduled and s.slack(now) < self.buffer_s

    def pick(
        self, streams: Sequence[StreamState], now: float, talker_busy: bool, talker_urgent: bool = False
    ) -> Optional[CodecBatch]:
        """The codec batch to run now, or None (a talker step, or nothing). ``talker_busy``: the
        talker has rows to step; ``talker_urgent``: one of them still waits for its first chunk's
        frames (then critical decodes alternate with talker steps too: time to first audio)."""
        cands = self.candidates(streams, now, talker_busy)
        for _, reason, _, s in cands:
            if s.t_ready is None and reason != "ahead":  # ahead: not due (scheduling lag)
                s.t_ready = now
        if cands and cands[0][1] == "ahead" and len(cands) < self.ahead_batch:
            cands = []  # too few full chunks for an ahead call: they wait for more
        if not cands:
            self._last_was_codec = False
            return None
        key, reason, frames, _ = cands[0]
        alternate = reason in ("due", "done", "ahead") or (talker_urgent and reason != "first")
        if talker_busy and self._last_was_codec and alternate:
            self._last_was_codec = False  # a talker step between two decodes
            return None
        group = [c[3] for c in cands if c[2] == frames][: self.max_batch]
        if reason != "first" and len(group) < self.max_batch:
            # ride-alongs (module docstring): one batch decodes their chunk cheaper than a later
            # call of its own
            taken = {s.sid for s in group}
            extra = [s for s in streams if s.sid not in taken and self._rides_along(s, frames, now)]
            extra.sort(key=lambda s: s.slack(now))
            group += extra[: self.max_batch - len(group)]
        self._last_was_codec = True
        return CodecBatch(frames, tuple(s.sid for s in group), reason)
