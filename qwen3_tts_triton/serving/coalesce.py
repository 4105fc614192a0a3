"""Frame coalescing between `talker` and `tts` (pure; no Triton, no engine).

The tts model decodes audio only at chunk boundaries (``streaming.ChunkScheduler``: 2, 4, 8, 16,
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
    """Buffers ``[n, 16]`` frame arrays and releases them in the given sizes (the last size
    repeats). ``sizes=None`` passes every array through unchanged."""

    def __init__(self, sizes: Optional[Sequence[int]]):
        self.sizes = list(sizes) if sizes else None
        self._buf: List[np.ndarray] = []
        self._n = 0
        self._index = 0

    def _target(self) -> int:
        return self.sizes[min(self._index, len(self.sizes) - 1)]

    def push(self, frames: np.ndarray) -> List[np.ndarray]:
        """Add frames; return the responses now complete (zero or more, in order)."""
        if self.sizes is None:
            return [frames] if len(frames) else []
        if len(frames):
            self._buf.append(frames)
            self._n += len(frames)
        out = []
        while self._n >= self._target():
            size = self._target()
            allf = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf, axis=0)
            out.append(allf[:size])
            rest = allf[size:]
            self._buf = [rest] if len(rest) else []
            self._n -= size
            self._index += 1
        return out

    def flush(self) -> Optional[np.ndarray]:
        """The remaining frames (end of stream), or None."""
        if not self._n:
            return None
        allf = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf, axis=0)
        self._buf, self._n = [], 0
        return allf
