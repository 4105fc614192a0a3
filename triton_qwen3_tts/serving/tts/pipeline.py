"""The `tts` streaming pipeline: talker frames -> codec chunks -> audio (pure asyncio, no Triton).

The Triton adapter (``model_repository/tts/1/model.py``) supplies three callables:

* ``frames``: an async iterator of int arrays ``[n, 16]`` from the talker (n >= 1 per item);
* ``decode(codes [T, 16], left_context) -> float32 samples [(T - left_context) * 1920]``: one codec
  call (a BLS request to ``codec_decoder``; concurrent streams' calls batch there);
* ``cancelled() -> bool``: whether the client has gone.

The pipeline owns the order of work: it feeds arriving frames to the chunk schedule, decodes each
chunk with its left context, trims the context samples and yields audio in order. Cancellation is
checked between chunks. The talker engine keeps generating while a chunk decodes (its frames
buffer in ``frames``), so generation and decoding overlap across the two models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, List, Optional, Protocol

import numpy as np

SAMPLES_PER_FRAME = 1920


class Cancelled(Exception):
    """The client cancelled the request; the caller aborts the talker and sends nothing more."""


class _Chunk(Protocol):
    start: int
    end: int
    context_start: int
    final: bool


class _Scheduler(Protocol):
    def push(self, n_new: int) -> List[_Chunk]: ...
    def flush(self) -> List[_Chunk]: ...


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 [n]
    first_frame: int
    num_frames: int
    final: bool


async def stream_audio(
    frames: AsyncIterator[np.ndarray],
    decode: Callable[[np.ndarray, int], Awaitable[np.ndarray]],
    scheduler: _Scheduler,
    cancelled: Callable[[], bool] = lambda: False,
    samples_per_frame: int = SAMPLES_PER_FRAME,
    prefix: Optional[np.ndarray] = None,
    left_context_frames: int = 0,
    on_first_frames: Optional[Callable[[], None]] = None,
) -> AsyncIterator[AudioChunk]:
    """Yield trimmed audio chunks in order; the last one has ``final=True`` (possibly empty).

    ``prefix`` (``[P, 16]``, Base in-context mode: the reference codes) is codec context only,
    never audio: a chunk whose scheduled context reaches frame 0 takes up to
    ``left_context_frames`` frames of context in total, the missing ones from the end of the
    prefix, as the official wrapper decodes ``concat(ref_codes, generated)`` and drops the
    reference's samples. Windows stay within ``left_context_frames`` + chunk.
    ``on_first_frames`` is called once, when the talker's first frames arrive (TTFA breakdown).
    """
    codes: List[np.ndarray] = [] if prefix is None else [np.asarray(prefix).reshape(-1, 16)]
    n_prefix = 0 if prefix is None else codes[0].shape[0]
    total = 0
    sent_final = False

    async def run(chunk) -> AudioChunk:
        left = chunk.start - chunk.context_start
        extra = min(n_prefix, max(0, left_context_frames - left)) if chunk.context_start == 0 else 0
        if len(codes) > 1:  # one array per talker response; keep them joined for the next chunk
            codes[:] = [np.concatenate(codes, axis=0)]
        window = codes[0][n_prefix + chunk.context_start - extra : n_prefix + chunk.end]
        left += extra
        audio = await decode(window, left)
        expected = (chunk.end - chunk.start) * samples_per_frame
        if audio.shape != (expected,):
            raise RuntimeError(
                f"codec returned {audio.shape} samples for frames [{chunk.start}, {chunk.end}); expected ({expected},)"
            )
        return AudioChunk(audio, chunk.start, chunk.end - chunk.start, chunk.final)

    async for item in frames:
        if on_first_frames is not None:
            on_first_frames()
            on_first_frames = None
        if cancelled():
            raise Cancelled()
        item = np.asarray(item)
        if item.ndim != 2 or item.shape[1] != 16 or item.shape[0] == 0:
            raise RuntimeError(f"talker sent frames of shape {item.shape}; expected [n>=1, 16]")
        codes.append(item)
        total += item.shape[0]
        for chunk in scheduler.push(item.shape[0]):
            out = await run(chunk)
            sent_final = sent_final or out.final
            yield out
            if cancelled():
                raise Cancelled()
    for chunk in scheduler.flush():
        out = await run(chunk)
        sent_final = sent_final or out.final
        yield out
    if not sent_final:
        yield AudioChunk(np.zeros(0, np.float32), total, 0, True)


async def forward_audio(
    chunks: AsyncIterator[np.ndarray],
    cancelled: Callable[[], bool] = lambda: False,
    samples_per_frame: int = SAMPLES_PER_FRAME,
    on_first_frames: Optional[Callable[[], None]] = None,
) -> AsyncIterator[AudioChunk]:
    """The fused pipeline's side of :func:`stream_audio`: the talker already sends audio (float32
    chunks of whole frames, ``serving/talker/fused.py``); pass them on in order, then an empty
    final chunk. Cancellation is checked between chunks."""
    total = 0
    async for item in chunks:
        if on_first_frames is not None:
            on_first_frames()
            on_first_frames = None
        if cancelled():
            raise Cancelled()
        samples = np.asarray(item, np.float32).reshape(-1)
        if samples.size == 0 or samples.size % samples_per_frame:
            raise RuntimeError(
                f"talker sent {samples.size} samples; expected a positive multiple of {samples_per_frame}"
            )
        n = samples.size // samples_per_frame
        yield AudioChunk(samples, total, n, False)
        total += n
        if cancelled():
            raise Cancelled()
    yield AudioChunk(np.zeros(0, np.float32), total, 0, True)


class StreamResampler:
    """Streaming float32 mono resampling with soxr's ``ResampleStream`` (quality "HQ", the same
    filter as ``model/audio.py`` ``resample``); the identity when the rates are equal. Feed the
    chunks in order; ``last=True`` on the final one flushes the filter's delay, so the stream
    ends with ``round(n * out_rate / in_rate)`` samples in all (within one sample)."""

    def __init__(self, in_rate: int, out_rate: int):
        self.in_rate, self.out_rate = int(in_rate), int(out_rate)
        self._rs = None
        if self.in_rate != self.out_rate:
            import soxr

            self._rs = soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="float32", quality="HQ")

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        x = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        if self._rs is None:
            return x
        return np.asarray(self._rs.resample_chunk(x, last=last), dtype=np.float32)


def to_sample_format(samples: np.ndarray, sample_format: str) -> np.ndarray:
    """float32 [-1, 1] -> the requested wire format."""
    if sample_format == "float32":
        return samples.astype(np.float32, copy=False)
    if sample_format == "int16":
        return np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int16)
    raise ValueError(f"sample_format must be float32 or int16, got {sample_format!r}")


def trim_window(
    audio: np.ndarray, left_context: int, samples_per_frame: int = SAMPLES_PER_FRAME, num_frames: Optional[int] = None
) -> np.ndarray:
    """Drop the left-context samples (and right padding beyond ``num_frames`` new frames)."""
    start = left_context * samples_per_frame
    end = None if num_frames is None else start + num_frames * samples_per_frame
    return audio[start:end]
