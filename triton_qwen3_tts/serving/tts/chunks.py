"""Codec chunk schedule for streaming audio out (pure: no torch, no vLLM, no Triton).

The talker emits one 16-code frame per decode step (80 ms of audio at 12.5 Hz). The codec decoder
is strictly causal with zero lookahead, so a frame's 1920 samples can be produced as
soon as that frame exists. We do not carry decoder state between calls; instead every chunk is
decoded *stateless* as ``codes[context_start:end]`` and the first
``(start - context_start) * samples_per_frame`` samples (the left context's audio) are dropped.

Why this shape of schedule:

* **Time to first audio.** The first chunk goes out as soon as ``first_chunk_frames`` (default 2,
  160 ms of audio) exist, with no left context.
* **Ramp.** Small chunks right after the first keep the client ahead of playback while the
  talker is still warming up; later chunks grow to ``chunk_frames`` (default 25, 2 s) so the
  codec is called rarely and batches well.
* **Left context 72.** The decoder's attention has a sliding window of 72 frames
  (``sliding_window`` of ``speech_tokenizer/config.json``); with less left context the chunk
  seams are audibly noisy (vLLM-Omni, https://github.com/vllm-project/vllm-omni, moved its
  default left context from 25 to 72 frames and warns below the window). Stateless chunking is
  still an approximation (8 attention layers reach 8 x 71 = 568 frames back,
  docs/codec_window_error.md); it is exact only when the context covers the whole prefix.
* **Bounded windows.** Every decoded window is at most ``left_context_frames + max chunk``
  frames (97 by default), which is what a TensorRT optimization profile and CUDA-graph
  buckets need. Several thresholds' worth of frames arriving at once therefore produce several
  chunks, never one oversized chunk.

Chunks exactly tile ``[0, total_frames)``: in order, no gap, no overlap. The final chunk
(``flush``) holds whatever remains; if nothing remains, ``flush`` returns no chunk and the caller
sends an empty final response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

# 8192 frames = max_new_tokens of the official generation_config.json (655 s of audio): no chunk,
# context or window may exceed it (the stream itself is not bounded here).
MAX_FRAMES = 8192
SAMPLES_PER_FRAME = 1920


def _check_int(name: str, value, lo: int, hi: int) -> int:
    """An ``int`` (``bool`` refused) in ``[lo, hi]``, or a ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


@dataclass(frozen=True)
class ScheduleConfig:
    """Chunk sizes in frames (1 frame = ``samples_per_frame`` samples = 80 ms at 24 kHz).

    Chunk k (0-based) has ``first_chunk_frames`` frames for k == 0, ``ramp[k-1]`` frames for
    1 <= k <= len(ramp), and ``chunk_frames`` afterwards; the final chunk may be shorter.
    """

    first_chunk_frames: int = 2
    # Same defaults as the Triton settings (serving/repository.py chunk_ramp "4,8,16").
    ramp: Tuple[int, ...] = (4, 8, 16)
    chunk_frames: int = 25
    left_context_frames: int = 72
    samples_per_frame: int = SAMPLES_PER_FRAME
    # Upper bound for every frame count above (and for the decoded window), e.g. a TensorRT
    # profile's max frames. The window is left_context_frames + the largest chunk.
    max_frames: int = MAX_FRAMES

    def __post_init__(self) -> None:
        _check_int("max_frames", self.max_frames, 1, MAX_FRAMES)
        _check_int("samples_per_frame", self.samples_per_frame, 1, 1 << 20)
        _check_int("chunk_frames", self.chunk_frames, 1, self.max_frames)
        _check_int("first_chunk_frames", self.first_chunk_frames, 1, self.max_frames)
        if self.first_chunk_frames > self.chunk_frames:
            raise ValueError(
                f"first_chunk_frames ({self.first_chunk_frames}) must be <= chunk_frames "
                f"({self.chunk_frames}): the first chunk exists to reach the client early"
            )
        _check_int("left_context_frames", self.left_context_frames, 0, self.max_frames)
        if isinstance(self.ramp, (str, bytes)) or not isinstance(self.ramp, (tuple, list)):
            raise ValueError(f"ramp must be a tuple of ints, got {type(self.ramp).__name__} {self.ramp!r}")
        for i, r in enumerate(self.ramp):
            try:
                _check_int(f"ramp[{i}]", r, 1, self.chunk_frames)
            except ValueError as e:
                if isinstance(r, int) and r > self.chunk_frames:
                    raise ValueError(f"{e} (chunk_frames {self.chunk_frames}: no ramp chunk may exceed it)") from None
                raise
        object.__setattr__(self, "ramp", tuple(self.ramp))
        if self.max_window_frames > self.max_frames:
            raise ValueError(
                f"left_context_frames + largest chunk = {self.max_window_frames} frames exceeds "
                f"max_frames={self.max_frames} (the largest window the decoder accepts)"
            )

    @property
    def max_window_frames(self) -> int:
        """The largest window ever decoded: left context + the largest chunk."""
        return self.left_context_frames + max((self.first_chunk_frames, self.chunk_frames) + self.ramp)

    def chunk_size(self, index: int) -> int:
        """Nominal size in frames of chunk ``index`` (0-based; the final chunk may be shorter)."""
        if index < 0:
            raise ValueError(f"chunk index must be >= 0, got {index}")
        if index == 0:
            return self.first_chunk_frames
        if index <= len(self.ramp):
            return self.ramp[index - 1]
        return self.chunk_frames


@dataclass(frozen=True)
class Chunk:
    """One codec call: decode ``codes[context_start:end]``, drop the first ``trim_samples``.

    The kept samples are exactly frames ``[start, end)``: ``(end - start) * samples_per_frame``.
    ``final`` is True only for the chunk returned by :meth:`ChunkScheduler.flush`.
    """

    start: int
    end: int
    context_start: int
    trim_samples: int
    final: bool

    @property
    def frames(self) -> int:
        """New frames whose audio this chunk delivers."""
        return self.end - self.start

    @property
    def context_frames(self) -> int:
        return self.start - self.context_start

    @property
    def window_frames(self) -> int:
        """Frames sent to the decoder (context included)."""
        return self.end - self.context_start


class ChunkScheduler:
    """Turns frame arrivals into chunks; one instance per request.

    ``push(n_new)`` reports ``n_new`` more frames and returns the chunks now complete (zero or
    more, in order). ``flush()`` ends the stream and returns the final partial chunk, if any.
    """

    def __init__(self, config: Optional[ScheduleConfig] = None) -> None:
        self.config = config if config is not None else ScheduleConfig()
        self._total = 0  # frames received
        self._emitted = 0  # frames covered by emitted chunks
        self._index = 0  # next chunk index
        self._finished = False

    @property
    def total_frames(self) -> int:
        return self._total

    @property
    def emitted_frames(self) -> int:
        return self._emitted

    @property
    def pending_frames(self) -> int:
        """Frames received but not yet in any chunk."""
        return self._total - self._emitted

    @property
    def finished(self) -> bool:
        return self._finished

    def _make(self, start: int, end: int, final: bool) -> Chunk:
        ctx = max(0, start - self.config.left_context_frames)
        self._emitted = end
        self._index += 1
        return Chunk(start, end, ctx, (start - ctx) * self.config.samples_per_frame, final)

    def push(self, n_new: int) -> List[Chunk]:
        """Add ``n_new`` (>= 0) frames; return every chunk that is now complete."""
        if self._finished:
            raise RuntimeError("push() after flush(): the stream has ended")
        if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 0:
            raise ValueError(f"n_new must be an int >= 0, got {n_new!r}")
        self._total += n_new
        out: List[Chunk] = []
        while True:
            size = self.config.chunk_size(self._index)
            if self._total - self._emitted < size:
                return out
            out.append(self._make(self._emitted, self._emitted + size, final=False))

    def flush(self) -> List[Chunk]:
        """End the stream: return ``[final chunk]`` with the remaining frames, or ``[]`` if none
        remain (then the caller sends an empty final response). Callable once."""
        if self._finished:
            raise RuntimeError("flush() called twice")
        self._finished = True
        if self._total == self._emitted:
            return []
        return [self._make(self._emitted, self._total, final=True)]


def plan_chunks(
    total_frames: int, config: Optional[ScheduleConfig] = None, arrivals: Optional[Iterable[int]] = None
) -> List[Chunk]:
    """All chunks of a stream of ``total_frames`` frames (one per push by default).

    ``arrivals`` gives the frame counts of successive pushes (sum == total_frames); the chunk
    boundaries do not depend on it, only on when chunks become available.
    """
    _check_int("total_frames", total_frames, 0, 1 << 31)
    sched = ChunkScheduler(config)
    arrivals = [1] * total_frames if arrivals is None else list(arrivals)
    if sum(arrivals) != total_frames:
        raise ValueError(f"arrivals sum to {sum(arrivals)}, expected total_frames={total_frames}")
    chunks: List[Chunk] = []
    for n in arrivals:
        chunks.extend(sched.push(n))
    chunks.extend(sched.flush())
    return chunks


def stream_decode(
    codes: Sequence,
    decode: Callable[[Sequence], Sequence[float]],
    config: Optional[ScheduleConfig] = None,
    arrivals: Optional[Iterable[int]] = None,
) -> list:
    """Decode ``codes`` (frames-major, ``[T, ...]``) chunk by chunk as a server would; return the
    list of per-chunk kept audio pieces (each ``chunk.frames * samples_per_frame`` samples).

    ``decode(window)`` maps a window of frames ``[n, ...]`` to ``n * samples_per_frame`` samples.
    Concatenated, the pieces have ``T * samples_per_frame`` samples; with a left context that
    covers the whole prefix (``left_context_frames >= T``) they equal a whole-utterance decode up
    to float noise, because the decoder is causal. This is the helper for that equivalence test.
    """
    cfg = config if config is not None else ScheduleConfig()
    pieces = []
    for ch in plan_chunks(len(codes), cfg, arrivals):
        audio = decode(codes[ch.context_start : ch.end])
        expected = ch.window_frames * cfg.samples_per_frame
        if len(audio) != expected:
            raise ValueError(f"decode returned {len(audio)} samples for {ch.window_frames} frames, expected {expected}")
        pieces.append(audio[ch.trim_samples :])
    return pieces
