"""Metric arithmetic of the service benchmark (``benchmark/benchmark_service.py``).

Pure functions over recorded timings: no tritonclient, no server. All times are seconds.

Per request (a :class:`RequestRecord`):

* **TTFA** (time to first audio): send -> arrival of the first *non-empty* audio chunk.
* **latency**: send -> final response (end to end).
* **audio seconds**: total samples of all chunks / sample rate.
* **RTF** (real-time factor): latency / audio seconds (< 1 is faster than real time). This is
  the plain RTF, *not* the inverse "xRT" (audio seconds per wall second) that earlier tools
  called RTF; the aggregate ``audio_s_per_s`` is that throughput figure.
* **underruns**: a simulated real-time player starts playing at the first chunk's arrival and
  plays every chunk back to back. A later chunk that arrives *after* the audio received so far
  has finished playing is an underrun (the listener hears a gap); the gap is
  ``arrival - end of queued audio`` and playback resumes at the arrival. A chunk arriving
  exactly when the queued audio ends is not an underrun. Empty chunks are ignored.

Per load level (:func:`aggregate`): mean, p50, p95, p99 of TTFA, latency, RTF and underrun gap
seconds over the successful requests; ``req_per_s`` = successful requests / wall seconds;
``audio_s_per_s`` = audio seconds of successful requests / wall seconds; failures (by error
code). Wall seconds = first send -> last final response of the measured (non-warm-up) requests.

Percentiles use numpy's default **linear** method (``np.percentile(x, q, method="linear")``,
"type 7" of Hyndman & Fan): the sorted values x[0..n-1] sit at ranks 0..n-1 and the q-th
percentile is interpolated linearly at rank ``(n - 1) * q / 100``. With one value every
percentile is that value.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

PERCENTILE_METHOD = "linear"
PERCENTILES = (50, 95, 99)
DEFAULT_SAMPLE_RATE = 24000


@dataclass
class RequestRecord:
    """What the benchmark saw of one request. ``t_send`` is on the benchmark's own clock
    (seconds since the level started); chunk arrival times are relative to the send."""

    t_send: float
    ok: bool
    latency: Optional[float] = None  # send -> final response; None when it never finished
    ttfa: Optional[float] = None  # send -> first non-empty chunk
    chunks: List[Tuple[float, int]] = field(default_factory=list)  # (arrival s after send, samples)
    sample_rate: int = DEFAULT_SAMPLE_RATE
    error: Optional[str] = None
    error_code: Optional[str] = None
    text_id: str = ""
    level: Optional[float] = None
    scheduled: Optional[float] = None  # open loop: the planned arrival (t_send - scheduled = lateness)
    worker: Optional[int] = None  # closed loop: the worker (stream) that sent it, one request at a time


def audio_seconds(chunks: Sequence[Tuple[float, int]], sample_rate: int = DEFAULT_SAMPLE_RATE) -> float:
    return sum(int(n) for _, n in chunks) / float(sample_rate)


def first_audio(chunks: Sequence[Tuple[float, int]]) -> Optional[float]:
    """Arrival of the first non-empty chunk (TTFA when arrivals are relative to the send)."""
    for t, n in chunks:
        if n > 0:
            return float(t)
    return None


def underruns(chunks: Sequence[Tuple[float, int]], sample_rate: int = DEFAULT_SAMPLE_RATE) -> Tuple[int, float]:
    """Simulate a real-time player; return ``(number of underruns, total gap seconds)``."""
    count, gap = 0, 0.0
    play_end = None  # wall time at which the audio queued so far finishes playing
    for t, n in sorted(((float(t), int(n)) for t, n in chunks if n > 0), key=lambda c: c[0]):
        dur = n / float(sample_rate)
        if play_end is None:
            play_end = t + dur
        elif t > play_end:
            count += 1
            gap += t - play_end
            play_end = t + dur
        else:
            play_end += dur
    return count, gap


def request_metrics(r: RequestRecord) -> Dict[str, Optional[float]]:
    """Per-request metrics (TTFA and RTF are None where undefined)."""
    audio = audio_seconds(r.chunks, r.sample_rate)
    ttfa = r.ttfa if r.ttfa is not None else first_audio(r.chunks)
    n_under, gap = underruns(r.chunks, r.sample_rate)
    rtf = (r.latency / audio) if (r.latency is not None and audio > 0) else None
    return {
        "ttfa": ttfa,
        "latency": r.latency,
        "audio_s": audio,
        "rtf": rtf,
        "underruns": n_under,
        "underrun_s": gap,
        "n_chunks": len([c for c in r.chunks if c[1] > 0]),
    }


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """numpy linear percentile; None for no values."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return float(np.percentile(np.asarray(vals, dtype=np.float64), q, method=PERCENTILE_METHOD))


def summarize(values: Iterable[Optional[float]]) -> Dict[str, Optional[float]]:
    """``{n, mean, p50, p95, p99}`` over the non-None values (None statistics when empty)."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    out: Dict[str, Optional[float]] = {"n": len(vals), "mean": (sum(vals) / len(vals)) if vals else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(vals, q)
    return out


def wall_seconds(records: Sequence[RequestRecord]) -> float:
    """First send -> last final response (requests that never finished count up to their last
    chunk, or their send)."""
    if not records:
        return 0.0
    start = min(r.t_send for r in records)
    ends = []
    for r in records:
        if r.latency is not None:
            ends.append(r.t_send + r.latency)
        elif r.chunks:
            ends.append(r.t_send + max(t for t, _ in r.chunks))
        else:
            ends.append(r.t_send)
    return max(ends) - start


def aggregate(
    records: Sequence[RequestRecord], wall: Optional[float] = None, level: Optional[float] = None, mode: str = ""
) -> Dict[str, object]:
    """Aggregate one load level. ``wall`` defaults to :func:`wall_seconds`."""
    wall = wall_seconds(records) if wall is None else float(wall)
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    per = [request_metrics(r) for r in ok]
    audio_total = sum(m["audio_s"] for m in per)
    codes = Counter((r.error_code or "ERROR") for r in failed)
    lateness = [r.t_send - r.scheduled for r in records if r.scheduled is not None]
    out = {
        "mode": mode,
        "level": level,
        "requests": len(records),
        "ok": len(ok),
        "failures": len(failed),
        "failure_codes": dict(sorted(codes.items())),
        "wall_s": wall,
        "req_per_s": (len(ok) / wall) if wall > 0 else None,
        "audio_s": audio_total,
        "audio_s_per_s": (audio_total / wall) if wall > 0 else None,
        "ttfa": summarize(m["ttfa"] for m in per),
        "latency": summarize(m["latency"] for m in per),
        "rtf": summarize(m["rtf"] for m in per),
        "underrun_gap_s": summarize(m["underrun_s"] for m in per),
        "underruns_total": int(sum(m["underruns"] for m in per)),
        "requests_with_underrun": int(sum(1 for m in per if m["underruns"] > 0)),
        "percentile_method": f"numpy {PERCENTILE_METHOD}",
    }
    if lateness:
        out["send_lateness_s"] = summarize(lateness)
    return out


def record_row(r: RequestRecord) -> Dict[str, object]:
    """Flat per-request row (for JSON/CSV): the record without its chunk list, plus metrics."""
    d = asdict(r)
    d.pop("chunks")
    d.update(request_metrics(r) if r.ok else {"audio_s": audio_seconds(r.chunks, r.sample_rate)})
    return d


def flat_level_row(agg: Dict[str, object]) -> Dict[str, object]:
    """One CSV row per level: nested statistics become ``ttfa_p95`` style columns."""
    row: Dict[str, object] = {}
    for k, v in agg.items():
        if isinstance(v, dict) and k != "failure_codes":
            for sk, sv in v.items():
                row[f"{k}_{sk}"] = sv
        elif k == "failure_codes":
            row[k] = ";".join(f"{c}={n}" for c, n in v.items())
        else:
            row[k] = v
    return row
