"""Frame coalescing between `talker` and `tts` (pure; no Triton, no engine).

The tts model decodes audio only at chunk boundaries (``tts.chunks.ChunkScheduler``: 2, 4, 8, 16,
then 25 frames), so a talker response per frame costs one Python-backend IPC message, one BLS
iterator step and its bookkeeping for every frame of every stream: on the H100 that serial work,
not the GPU, bounded the service at about 770 frames/s (docs/benchmarks.md, end-to-end run 1).
The tts therefore sends its chunk sizes as the talker input ``response_frames`` and the talker
answers with exactly one response per chunk: a response leaves the moment its chunk is complete,
so no latency is added. The remainder goes out at the end of the stream.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

MAX_SIZES = 64
MAX_FRAMES_PER_RESPONSE = 4096


def check_response_frames(sizes) -> Optional[List[int]]:
    """Validate the ``response_frames`` input: None/empty -> None (one response per engine
    yield), else a list of ints in [1, 4096], at most 64 entries. Raises ValueError."""
    if sizes is None:
        return None
    arr = np.asarray(sizes).reshape(-1)
    if arr.size == 0:
        return None
    if arr.size > MAX_SIZES or arr.dtype.kind not in "iu":
        raise ValueError(f"must be at most {MAX_SIZES} integers, got {arr.size} of {arr.dtype}")
    vals = [int(v) for v in arr]
    if any(not 1 <= v <= MAX_FRAMES_PER_RESPONSE for v in vals):
        raise ValueError(f"every size must be in [1, {MAX_FRAMES_PER_RESPONSE}], got {vals}")
    return vals


class FrameCoalescer:
    """Buffers ``[n, 16]`` frame arrays and releases them at chunk boundaries of the given sizes
    (the last size repeats). ``sizes=None`` passes every array through unchanged.

    ``push`` returns at most one array: every chunk completed by the new frames, together (when
    the engine hands over several frames at once, e.g. after a stall, two complete chunks leave
    in one response; the tts's ChunkScheduler splits them again). A response therefore always
    ends on a chunk boundary and leaves the moment that boundary is reached."""

    def __init__(self, sizes: Optional[Sequence[int]]):
        self.sizes = list(sizes) if sizes else None
        self._buf: List[np.ndarray] = []
        self._n = 0  # frames buffered
        self._need = self.sizes[0] if self.sizes else 0  # frames buffered until the next boundary
        self._index = 0  # the chunk being filled

    def _next_size(self) -> int:
        self._index += 1
        return self.sizes[min(self._index, len(self.sizes) - 1)]

    def push(self, frames: np.ndarray) -> Optional[np.ndarray]:
        """Add frames; return the frames of every chunk now complete (None if none is)."""
        n = len(frames)
        if self.sizes is None:
            return frames if n else None
        if not n:
            return None
        self._buf.append(frames)
        self._n += n
        if self._n < self._need:
            return None
        cut = self._need  # the last boundary within the buffer
        while True:
            size = self._next_size()
            if cut + size > self._n:
                break
            cut += size
        self._need = cut + size
        allf = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf, axis=0)
        rest = allf[cut:]
        self._buf = [rest] if len(rest) else []
        self._n -= cut
        self._need -= cut
        return allf[:cut]

    def flush(self) -> Optional[np.ndarray]:
        """The remaining frames (end of stream), or None."""
        if not self._n:
            return None
        allf = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf, axis=0)
        self._buf, self._n = [], 0
        return allf
