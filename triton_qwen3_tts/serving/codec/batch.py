"""Batching for the Python-backend `codec_decoder` (pure numpy around a decode callable).

Triton's dynamic batcher hands the Python backend a *list* of requests; it does not concatenate
them: ``execute()`` gets the list and must stack and split the rows itself. Each request carries
``audio_codes`` ``[b, T, 16]`` with its own ``T`` (the input
allows ragged batching). We stack all rows into one ``[B, T_max, 16]`` call, right-padding shorter
windows with code 0. Right padding is exact for the kept samples because the decoder is strictly
causal with zero lookahead: samples of frame t depend only on frames <= t. Each request then gets back its
own rows, trimmed to ``T * 1920`` samples.

Bucketing ``T_max`` up to a fixed set (``frame_buckets``) keeps the number of distinct shapes small,
which is what CUDA graphs (one per (batch, frames) bucket) and TensorRT profiles need.
"""

from __future__ import annotations

import bisect
from typing import Callable, List, Optional, Sequence

import numpy as np

NUM_QUANTIZERS = 16


def bucket(n: int, buckets: Optional[Sequence[int]]) -> int:
    """Smallest bucket >= n (n itself when no bucket fits or none are given)."""
    if not buckets:
        return n
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else n


def check_codes(codes: np.ndarray, codebook_size: int = 2048, max_frames: Optional[int] = None) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.ndim != 3 or codes.shape[2] != NUM_QUANTIZERS:
        raise ValueError(f"audio_codes must have shape [batch, frames, {NUM_QUANTIZERS}], got {list(codes.shape)}")
    if codes.shape[0] < 1 or codes.shape[1] < 1:
        raise ValueError(f"audio_codes must have at least one row and one frame, got {list(codes.shape)}")
    if not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"audio_codes must be integers, got {codes.dtype}")
    if max_frames is not None and codes.shape[1] > max_frames:
        raise ValueError(f"audio_codes has {codes.shape[1]} frames; the limit is {max_frames}")
    lo, hi = int(codes.min()), int(codes.max())
    if lo < 0 or hi >= codebook_size:
        raise ValueError(f"audio_codes values must be in [0, {codebook_size}), got [{lo}, {hi}]")
    return codes


def decode_batched(
    requests: List[np.ndarray],
    decode: Callable[[np.ndarray], np.ndarray],
    samples_per_frame: int = 1920,
    frame_buckets: Optional[Sequence[int]] = None,
    max_batch: Optional[int] = None,
) -> List[np.ndarray]:
    """Decode a list of ``[b_i, T_i, 16]`` windows; return ``[b_i, T_i * samples_per_frame]`` each.

    ``decode`` takes int64 ``[B, T, 16]`` and returns float32 ``[B, T * samples_per_frame]``.
    Rows are processed in slices of at most ``max_batch``.
    """
    rows = [r for req in requests for r in req]
    lens = [req.shape[1] for req in requests for _ in range(req.shape[0])]
    out_rows: List[np.ndarray] = []
    step = max_batch or len(rows)
    for s in range(0, len(rows), step):
        part, plens = rows[s : s + step], lens[s : s + step]
        t = bucket(max(plens), frame_buckets)
        batch = np.zeros((len(part), t, NUM_QUANTIZERS), dtype=np.int64)
        for i, r in enumerate(part):
            batch[i, : r.shape[0]] = r
        audio = np.asarray(decode(batch))
        if audio.shape != (len(part), t * samples_per_frame):
            raise RuntimeError(f"decoder returned {audio.shape}, expected {(len(part), t * samples_per_frame)}")
        out_rows.extend(audio[i, : n * samples_per_frame] for i, n in enumerate(plens))
    result, k = [], 0
    for req in requests:
        result.append(np.stack(out_rows[k : k + req.shape[0]]).astype(np.float32, copy=False))
        k += req.shape[0]
    return result
