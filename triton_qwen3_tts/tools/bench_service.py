"""End-to-end service benchmark: sweeps a running triton-qwen3-tts server over gRPC streaming.

``qwen3-tts-bench-service`` (also ``python benchmark/benchmark_service.py``).

Closed loop (``--concurrency 1 4 8``): N workers send requests back to back until
``--requests-per-level`` requests are done (or ``--duration`` seconds have passed).
Open loop (``--rate 0.5 1 2``): requests arrive as a seeded Poisson process at R req/s
(``--requests-per-level`` arrivals, or arrivals during ``--duration`` s), independent of how fast
the server answers. Requests go through ``triton_qwen3_tts.tools.client.StreamingClient``: each request
has a gRPC stream of its own, so each error is the error of its own request, and a request the
benchmark stops waiting for (``--timeout`` without a response) is cancelled on the server.

Each level starts with ``--warmup`` requests that are not measured. A level (and its warm-up)
ends by draining: after its last send it waits up to ``--drain-timeout`` s for its requests still
in flight; the ones left then are cancelled, and the output says that the level did not drain and
how many it cancelled (``not_drained`` in the JSON), so the next level never starts with the
previous one's requests unnoticed.

Texts come from the built-in English + Chinese set (``triton_qwen3_tts/tools/bench_texts.py``, ``--texts en|zh|all``)
or ``--dataset FILE`` (``id<TAB>text`` lines, seed-tts format), drawn with a seeded RNG. Metrics and
their definitions: ``triton_qwen3_tts/tools/bench_metrics.py`` (TTFA, latency, RTF = latency / audio,
playback underruns; mean/p50/p95/p99 with numpy's linear percentile; req/s; audio-seconds per
wall-second). The tables show underruns as the percentage of a level's successful requests that
had one (the JSON and CSV also carry it as ``underrun_pct``, and keep ``underruns_total`` and
``requests_with_underrun``).

Clip lengths (``--clip-frames-dist``): ``fixed`` (the default) leaves each request's length as
``--fixed-frames N`` (max_frames N with ignore_eos: every clip exactly N frames), ``--max-frames N``
(max_frames N without ignore_eos: the text's length, at most N frames) or, with neither, the text
alone. ``uniform:LO:HI`` draws each request's max_frames uniformly from the integers LO..HI (both
included) and sends it with ignore_eos, so each clip is exactly that long (one frame = 1920 samples
= 80 ms at 24 kHz; 50 frames = 4 s); it excludes --fixed-frames and --max-frames. The draws come
from an RNG seeded by ``--seed`` and the level's index (as the text choice, but a stream of its
own: the same seed picks the same texts with either distribution), in the order the level's
requests are sent, warm-up included. Each request row in the JSON has the ``max_frames`` it sent.

Capacity (open loop): after the table, a ``capacity:`` line gives the highest *offered* rate
(``--rate`` level) that passes: TTFA p95 <= ``--capacity-ttfa-p95-ms`` (100) and fewer than
``--capacity-underrun-pct`` (1) % of its requests with an underrun, with no failed request (a
request cancelled because the level did not drain is a failed one). A rate tested more than once
passes only if every level at it passes. Failing lower rates do not matter to it
(``capacity_rps``); ``capacity_rps_contiguous`` is the highest rate such that it and every lower
tested rate pass. None (JSON null) means no tested rate passed (contiguous: the lowest one failed).
The JSON has both and the thresholds (``capacity_ttfa_p95_ms``, ``capacity_underrun_pct``), each
open-loop level ``capacity_pass``; with ``--voice-cache both`` they are per pass, under
``capacity_by_voice_cache``.

    qwen3-tts-bench-service --concurrency 1 4 8 --requests-per-level 32 --warmup 4 \
        --out-json bench.json --out-csv bench.csv --plot bench.png
    qwen3-tts-bench-service --rate 0.5 1 2 --duration 60 --seed 1
    # streaming capacity: Poisson arrivals of clips of 3.2-4.8 s, capacity line after the table
    qwen3-tts-bench-service --rate 5 10 20 --duration 30 --clip-frames-dist uniform:40:60
    # random-weight checkpoints never stop on their own: force fixed-length requests
    qwen3-tts-bench-service --concurrency 1 8 --fixed-frames 100
    # CPU, no server running: start one on a checkpoint (vLLM-CPU talker, Python codec), sweep, stop
    qwen3-tts-bench-service --serve-cpu build/ckpt-tiny --concurrency 1 2 4 --fixed-frames 40
    # Base voice cloning, with and without the voice cache (--voice-cache both, the default with
    # --ref-audio): "fresh" sends the reference with a new voice_id per request (both encoders run
    # every time), "shared" stores it once and then sends one voice_id alone (no encoder runs)
    qwen3-tts-bench-service --task base --ref-audio ref.wav --ref-text "..." --concurrency 1 4
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import random
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from triton_qwen3_tts.tools import bench_metrics as bm
from triton_qwen3_tts.tools.bench_texts import load_dataset, load_texts

TASK_TYPES = {"customvoice": "CustomVoice", "voicedesign": "VoiceDesign", "base": "Base"}


def _task_type(s: str) -> str:
    key = s.replace("_", "").replace("-", "").lower()
    if key not in TASK_TYPES:
        raise argparse.ArgumentTypeError(f"unknown task type {s!r}: CustomVoice, VoiceDesign or Base")
    return TASK_TYPES[key]


def parse_clip_dist(s: str) -> Optional[Tuple[int, int]]:
    """``--clip-frames-dist``: ``fixed`` -> None; ``uniform:LO:HI`` -> ``(LO, HI)``, integers with
    1 <= LO <= HI. Raises ValueError with the reason for anything else."""
    if s.strip().lower() == "fixed":
        return None
    parts = s.split(":")
    if len(parts) != 3 or parts[0].strip().lower() != "uniform":
        raise ValueError(f"{s!r} is neither 'fixed' nor 'uniform:LO:HI' (e.g. uniform:40:60)")
    try:
        lo, hi = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"{s!r}: LO and HI of uniform:LO:HI must be integers (frames)") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{s!r}: uniform:LO:HI needs 1 <= LO <= HI")
    return lo, hi


def _clip_dist(s: str) -> str:
    try:
        parse_clip_dist(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def _positive(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
    return v


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="qwen3-tts-bench-service",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--url", default="127.0.0.1:8001", help="gRPC address of the server")
    p.add_argument("--model", default="tts")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, nargs="+", help="closed-loop levels (workers); default 1")
    load.add_argument("--rate", type=float, nargs="+", help="open-loop levels: Poisson arrivals per second")
    p.add_argument("--requests-per-level", type=int, default=16, help="measured requests per level (default 16)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per level instead of a request count (closed: stop sending after it; open: arrivals within it)",
    )
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests at the start of each level (default 2)")
    p.add_argument(
        "--streams",
        type=int,
        default=4,
        help="open loop: client objects the arrivals are spread over, round robin (each request "
        "has a gRPC stream of its own; gRPC shares one connection between them), and the "
        "warm-up concurrency (default 4)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of text choice and Poisson arrivals")
    p.add_argument("--texts", choices=["en", "zh", "all"], default="all", help="built-in text set")
    p.add_argument("--dataset", help="'id<TAB>text' file (seed-tts format) instead of the built-in texts")
    p.add_argument(
        "--fixed-frames",
        type=int,
        default=None,
        help="send max_frames N with ignore_eos (fixed-length requests, for random-weight checkpoints)",
    )
    p.add_argument("--max-frames", type=int, default=None, help="max_frames without ignore_eos")
    p.add_argument(
        "--clip-frames-dist",
        type=_clip_dist,
        default="fixed",
        metavar="fixed|uniform:LO:HI",
        help="clip length per request: 'fixed' (default) = as --fixed-frames/--max-frames/the text "
        "say; 'uniform:LO:HI' = max_frames drawn uniformly from the integers LO..HI (inclusive, "
        "seeded by --seed) with ignore_eos, so each clip is exactly that many frames (80 ms each); "
        "excludes --fixed-frames and --max-frames",
    )
    p.add_argument(
        "--capacity-ttfa-p95-ms",
        type=_positive,
        metavar="MS",
        default=100.0,
        help="open loop: a rate passes the capacity line with TTFA p95 <= this many ms (default 100)",
    )
    p.add_argument(
        "--capacity-underrun-pct",
        type=_positive,
        metavar="PCT",
        default=1.0,
        help="open loop: a rate passes the capacity line with fewer than this %% of its requests underrunning "
        "(and TTFA p95 within --capacity-ttfa-p95-ms, no failed request) (default 1)",
    )
    p.add_argument(
        "--task-type",
        "--task",
        dest="task_type",
        type=_task_type,
        help="CustomVoice, VoiceDesign or Base (case-insensitive; default: the checkpoint's)",
    )
    p.add_argument("--speaker")
    p.add_argument(
        "--language", help="override the language (default: the text set's, or server default for --dataset)"
    )
    p.add_argument("--instruct")
    p.add_argument("--ref-audio", help="Base: reference WAV (sent as ref_audio + ref_sample_rate)")
    p.add_argument("--ref-text", help="Base: transcript of --ref-audio")
    p.add_argument("--x-vector-only", action="store_true")
    p.add_argument("--voice-id", help="Base: cached voice id (passed through; implies --voice-cache off)")
    p.add_argument(
        "--voice-cache",
        choices=["both", "fresh", "shared", "off"],
        default=None,
        help="Base with --ref-audio: 'fresh' = the reference and a new voice_id per request (encoders "
        "run every time), 'shared' = store the voice once, then send its voice_id alone (cache "
        "hits), 'both' = fresh then shared (default with --ref-audio), 'off' = inputs as given",
    )
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument(
        "--request-seed",
        type=int,
        default=None,
        help="per-request sampling seed = this + request index (default: server random)",
    )
    p.add_argument("--sample-format", choices=["float32", "int16"])
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for each response; a request without one is cancelled on the server",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        help="seconds a level waits after its last send for its requests in flight; those left "
        "are cancelled and reported (default: --timeout)",
    )
    p.add_argument("--out-json", help="write config, per-level aggregates and per-request rows")
    p.add_argument("--out-csv", help="write one row per level")
    p.add_argument("--plot", help="PNG: TTFA p50/p95 and audio-seconds per second vs load level")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--serve-cpu",
        metavar="CHECKPOINT",
        help="start a CPU server on CHECKPOINT for the sweep (build a repository with the vLLM-CPU "
        "talker and the Python codec, start tritonserver on free ports, stop it at the end); "
        "--url is then ignored",
    )
    p.add_argument(
        "--serve-work", default=None, help="--serve-cpu: folder for the repository and logs (default: a temp dir)"
    )
    p.add_argument("--serve-max-num-seqs", type=int, default=8, help="--serve-cpu: talker max_num_seqs (default 8)")
    a = p.parse_args(argv)
    if not a.concurrency and not a.rate:
        a.concurrency = [1]
    if a.fixed_frames is not None and a.max_frames is not None:
        p.error("--fixed-frames and --max-frames are exclusive")
    a.clip_frames_range = parse_clip_dist(a.clip_frames_dist)
    if a.clip_frames_range is not None and (a.fixed_frames is not None or a.max_frames is not None):
        p.error("--clip-frames-dist uniform:LO:HI sets each request's max_frames: drop --fixed-frames/--max-frames")
    if (a.requests_per_level is None or a.requests_per_level < 1) and a.duration is None:
        p.error("--requests-per-level must be >= 1 (or give --duration)")
    if a.ref_text and not a.ref_audio:
        p.error("--ref-text needs --ref-audio")
    if a.drain_timeout is None:
        a.drain_timeout = a.timeout
    if a.voice_cache is None:
        a.voice_cache = "both" if a.ref_audio and not a.voice_id else "off"
    if a.voice_cache != "off" and (not a.ref_audio or a.voice_id):
        p.error("--voice-cache fresh|shared|both needs --ref-audio and no --voice-id")
    if a.voice_cache != "off" and not a.x_vector_only and not a.ref_text:
        p.error("--voice-cache needs --ref-text (in-context cloning) or --x-vector-only")
    return a


def request_inputs(a: argparse.Namespace, ref: Optional[Tuple[object, int]] = None) -> Dict[str, object]:
    """The per-run constant inputs (everything but text/language/seed)."""
    kw: Dict[str, object] = dict(
        task_type=a.task_type,
        speaker=a.speaker,
        instruct=a.instruct,
        ref_text=a.ref_text,
        voice_id=a.voice_id,
        temperature=a.temperature,
        top_k=a.top_k,
        sample_format=a.sample_format,
    )
    if a.fixed_frames is not None:
        kw["max_frames"], kw["ignore_eos"] = a.fixed_frames, True
    elif a.max_frames is not None:
        kw["max_frames"] = a.max_frames
    if a.x_vector_only:
        kw["x_vector_only"] = True
    if ref is not None:
        kw["ref_audio"], kw["ref_sample_rate"] = ref
    return {k: v for k, v in kw.items() if v is not None}


def read_ref_audio(path: str):
    import soundfile as sf

    wav, sr = sf.read(path, dtype="float32", always_2d=True)
    return wav.mean(axis=1), int(sr)


class TextPicker:
    """Seeded, thread-safe choice of (id, text, language) per request index, and of the request's
    clip length (:meth:`clip_frames`, from an RNG of its own so the texts do not depend on it)."""

    def __init__(
        self,
        texts: Sequence[Tuple[str, str, Optional[str]]],
        seed: int,
        language: Optional[str],
        clip_range: Optional[Tuple[int, int]] = None,
    ):
        self.texts, self.language = list(texts), language
        self.rng = random.Random(seed)
        self.clip_range = clip_range
        self.clip_rng = random.Random(f"clip-frames:{seed}")
        self.lock = threading.Lock()

    def pick(self) -> Tuple[str, str, Optional[str]]:
        with self.lock:
            uid, text, lang = self.rng.choice(self.texts)
        return uid, text, (self.language or lang)

    def clip_frames(self) -> Optional[int]:
        """The next request's max_frames under ``uniform:LO:HI`` (None with ``fixed``)."""
        if self.clip_range is None:
            return None
        with self.lock:
            return draw_clip_frames(self.clip_rng, self.clip_range)


def draw_clip_frames(rng: random.Random, clip_range: Tuple[int, int]) -> int:
    """One draw of ``uniform:LO:HI``: an integer uniform over LO..HI, both included."""
    lo, hi = clip_range
    return rng.randint(lo, hi)


class InFlight:
    """The requests of one level that were sent and have not finished, with the client each went
    through. :meth:`cancel_all` (the drain's bound passed) cancels them, and cancels at once any
    request of the level sent after it; ``cancelled`` counts both."""

    def __init__(self):
        self._lock = threading.Lock()
        self._live: Dict[str, object] = {}  # request id -> client
        self._closed = False
        self.cancelled = 0

    def add(self, client, rid: str) -> None:
        with self._lock:
            if not self._closed:
                self._live[rid] = client
                return
            self.cancelled += 1
        _cancel(client, rid)

    def done(self, rid: str) -> None:
        with self._lock:
            self._live.pop(rid, None)

    def cancel_all(self) -> None:
        with self._lock:
            self._closed = True
            left = list(self._live.items())
            self._live.clear()
            self.cancelled += len(left)
        for rid, client in left:
            _cancel(client, rid)


def _cancel(client, rid: str) -> None:
    """Cancel ``rid`` on the server (``StreamingClient.cancel``: its receive() then raises at once)."""
    cancel = getattr(client, "cancel", None)  # test doubles may have none
    if cancel is not None:
        cancel(rid)


def _one_request(
    client,
    t0: float,
    picker: TextPicker,
    base_kw: Dict[str, object],
    index: int,
    a: argparse.Namespace,
    scheduled: Optional[float] = None,
    sent: Optional[Callable[[], None]] = None,
    inflight: Optional[InFlight] = None,
) -> bm.RequestRecord:
    """Send one request on ``client`` and wait for it; never raises (errors become a record).
    The client attributes each error to its own request; a request without a response for
    ``--timeout`` s is cancelled on the server by ``receive`` (record code TIMEOUT)."""
    uid, text, lang = picker.pick()
    kw = dict(base_kw, text=text)
    frames = picker.clip_frames()
    if frames is not None:  # --clip-frames-dist uniform:LO:HI: exactly `frames` frames, as --fixed-frames does
        kw["max_frames"], kw["ignore_eos"] = frames, True
    if lang:
        kw["language"] = lang
    if a.request_seed is not None:
        kw["seed"] = a.request_seed + index
    if kw.pop("_fresh_voice_id", False):  # --voice-cache fresh: a voice the server has never seen
        kw["voice_id"] = f"bench-{uuid.uuid4().hex}"
    rec = _send_and_receive(client, t0, kw, uid, a, scheduled, sent, inflight)
    rec.max_frames = kw.get("max_frames")  # not a RequestRecord field: _sweep adds it to the request row
    return rec


def _send_and_receive(
    client,
    t0: float,
    kw: Dict[str, object],
    uid: str,
    a: argparse.Namespace,
    scheduled: Optional[float],
    sent: Optional[Callable[[], None]],
    inflight: Optional[InFlight],
) -> bm.RequestRecord:
    """The send and wait of :func:`_one_request` (inputs ``kw``); never raises."""
    from triton_qwen3_tts.tools.client import TtsError, build_inputs

    t_send = time.perf_counter()
    try:
        rid = client.send(build_inputs(**kw))
    except Exception as e:  # an input the client cannot send (connection failures come from receive)
        return bm.RequestRecord(
            t_send=t_send - t0,
            ok=False,
            error=str(e),
            error_code=getattr(e, "code", None) or "SEND",
            text_id=uid,
            scheduled=scheduled,
        )
    finally:
        if sent is not None:
            sent()
    if inflight is not None:
        inflight.add(client, rid)
    try:
        res = client.receive(rid, t_send, a.timeout)
    except TtsError as e:  # the server's error for this request, its stream failed, or the drain cancelled it
        return bm.RequestRecord(
            t_send=t_send - t0,
            ok=False,
            latency=time.perf_counter() - t_send,
            error=str(e),
            error_code=e.code or "ERROR",
            text_id=uid,
            scheduled=scheduled,
        )
    except queue.Empty:
        return bm.RequestRecord(
            t_send=t_send - t0,
            ok=False,
            error=f"no response within {a.timeout:g} s (cancelled on the server)",
            error_code="TIMEOUT",
            text_id=uid,
            scheduled=scheduled,
        )
    except Exception as e:
        return bm.RequestRecord(
            t_send=t_send - t0,
            ok=False,
            error=str(e) or type(e).__name__,
            error_code=type(e).__name__,
            text_id=uid,
            scheduled=scheduled,
        )
    finally:
        if inflight is not None:
            inflight.done(rid)
    return bm.RequestRecord(
        t_send=t_send - t0,
        ok=True,
        latency=res.total,
        ttfa=res.ttfa,
        chunks=[(float(t), int(n)) for t, n in res.chunks],
        sample_rate=int(res.sample_rate),
        text_id=uid,
        scheduled=scheduled,
    )


def _progress(total: Optional[int], desc: str, disable: bool):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="req", disable=disable, leave=False)
    except ImportError:  # pragma: no cover

        class _Null:
            def update(self, n=1):
                pass

            def close(self):
                pass

        return _Null()


def run_closed(
    level: int,
    a: argparse.Namespace,
    picker: TextPicker,
    base_kw: Dict[str, object],
    client_factory: Callable[[], object],
    count: Optional[int],
    duration: Optional[float],
    desc: str,
) -> Tuple[List[bm.RequestRecord], float, int]:
    """``level`` workers, one client each, back to back. Returns (records, wall seconds, requests
    cancelled because they had not finished ``--drain-timeout`` s after the last send)."""
    clients = [client_factory() for _ in range(level)]
    records: List[bm.RequestRecord] = []
    lock = threading.Lock()
    state = {"next": 0}
    sending_over = threading.Event()
    inflight = InFlight()
    bar = _progress(count, desc, a.no_progress)
    t0 = time.perf_counter()
    deadline = (t0 + duration) if duration is not None else None

    def take() -> Optional[int]:
        with lock:
            if (count is not None and state["next"] >= count) or (
                deadline is not None and time.perf_counter() >= deadline
            ):
                return None
            state["next"] += 1
            if count is not None and state["next"] >= count:
                sending_over.set()  # the level's last request was handed out
            return state["next"] - 1

    def worker(k):
        while True:
            i = take()
            if i is None:
                return
            r = _one_request(clients[k], t0, picker, base_kw, i, a, inflight=inflight)
            r.worker = k
            with lock:
                records.append(r)
            bar.update(1)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(clients))]
    try:
        for t in threads:
            t.start()
        # the sending phase: until the last request is handed out, or --duration passes
        while not sending_over.wait(0.1) and any(t.is_alive() for t in threads):
            if deadline is not None and time.perf_counter() >= deadline:
                break
        _drain(threads, inflight, a.drain_timeout)
    finally:
        bar.close()
        for c in clients:
            c.close()
    for r in records:
        r.level = level
    return records, bm.wall_seconds(records), inflight.cancelled


def _drain(threads: Sequence[threading.Thread], inflight: InFlight, timeout: float) -> None:
    """The level sent its last request: wait up to ``timeout`` s for the ``threads`` that wait
    for its requests, then cancel the requests still in flight and wait for the threads to record
    them (a cancelled request's receive returns at once)."""
    end = time.perf_counter() + timeout
    for t in threads:
        t.join(max(0.0, end - time.perf_counter()))
    if any(t.is_alive() for t in threads):
        inflight.cancel_all()
    for t in threads:
        t.join()


def poisson_arrivals(rate: float, seed: int, count: Optional[int], duration: Optional[float]) -> List[float]:
    """Arrival times (s from the level start) of a Poisson process: exponential gaps with mean
    1/rate, the first arrival at 0. ``count`` arrivals, or all arrivals before ``duration``."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        if count is not None and len(out) >= count:
            break
        if duration is not None and t >= duration:
            break
        out.append(t)
        t += rng.expovariate(rate)
    return out


def run_open(
    rate: float,
    a: argparse.Namespace,
    picker: TextPicker,
    base_kw: Dict[str, object],
    client_factory: Callable[[], object],
    arrivals: Sequence[float],
    desc: str,
) -> Tuple[List[bm.RequestRecord], float, int]:
    """Send at the planned arrival times regardless of outstanding requests. Returns as
    :func:`run_closed`."""
    clients = [client_factory() for _ in range(max(1, a.streams))]
    records: List[bm.RequestRecord] = []
    inflight = InFlight()
    bar = _progress(len(arrivals), desc, a.no_progress)
    pool = ThreadPoolExecutor(max_workers=max(8, min(512, len(arrivals))))
    t0 = time.perf_counter()
    futures = []
    try:
        for i, at in enumerate(arrivals):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = threading.Event()
            futures.append(
                pool.submit(_one_request, clients[i % len(clients)], t0, picker, base_kw, i, a, at, sent.set, inflight)
            )
            sent.wait(timeout=5.0)  # keep the send itself on schedule order
        # the last arrival is sent: drain (a request queued behind busy pool threads is sent
        # later; after cancel_all it is cancelled as soon as it is sent)
        _, pending = wait(futures, timeout=a.drain_timeout)
        if pending:
            inflight.cancel_all()
        for f in futures:
            records.append(f.result())
            bar.update(1)
    finally:
        pool.shutdown(wait=True)
        bar.close()
        for c in clients:
            c.close()
    for r in records:
        r.level = rate
    return records, bm.wall_seconds(records), inflight.cancelled


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


TABLE_HEAD = "{:>7} {:>5} {:>4} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>9}".format(
    "level", "ok", "fail", "req/s", "audio/s", "ttfa", "ttfa", "ttfa", "ttfa", "lat p50", "lat p95", "rtf", "underrun"
)
TABLE_HEAD2 = "{:>7} {:>5} {:>4} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>9}".format(
    "", "", "", "", "", "mean", "p50", "p95", "p99", "ms", "ms", "p50", "% ok"
)


def underrun_pct(agg: Dict[str, object]) -> Optional[float]:
    """Percentage of the level's successful requests that had at least one playback underrun."""
    return 100.0 * agg["requests_with_underrun"] / agg["ok"] if agg["ok"] else None


def capacity_misses(agg: Dict[str, object], ttfa_p95_ms: float = 100.0, max_underrun_pct: float = 1.0) -> List[str]:
    """Why one open-loop level does not pass the capacity criterion; [] = it passes. It passes with
    at least one request, no failed request, TTFA p95 <= ``ttfa_p95_ms`` and fewer than
    ``max_underrun_pct`` % of its requests with an underrun."""
    why = []
    if agg["failures"]:
        why.append(f"{agg['failures']} failed")
    if not agg["ok"]:
        why.append("no successful request")
        return why
    p95 = agg["ttfa"]["p95"]
    if p95 is None:
        why.append("no audio")
    elif p95 * 1000.0 > ttfa_p95_ms + 1e-9:
        why.append(f"TTFA p95 {p95 * 1000.0:.1f} ms > {ttfa_p95_ms:g} ms")
    pct = underrun_pct(agg)
    if pct >= max_underrun_pct:
        why.append(f"{pct:.1f} % underrun >= {max_underrun_pct:g} %")
    return why


def _rates_passing(aggs: Sequence[Dict[str, object]], ttfa_p95_ms: float, underrun_pct: float) -> Dict[float, bool]:
    """Offered rate -> whether every level run at it passes."""
    out: Dict[float, bool] = {}
    for agg in aggs:
        rate = float(agg["level"])
        out[rate] = out.get(rate, True) and not capacity_misses(agg, ttfa_p95_ms, underrun_pct)
    return out


def capacity(
    aggs: Sequence[Dict[str, object]], ttfa_p95_ms: float = 100.0, underrun_pct: float = 1.0
) -> Optional[float]:
    """Streaming capacity of an open-loop sweep: the highest offered rate (req/s, the level) whose
    levels all pass (:func:`capacity_misses`), whether or not lower rates pass. None: no tested
    rate passed."""
    ok = [r for r, p in _rates_passing(aggs, ttfa_p95_ms, underrun_pct).items() if p]
    return max(ok) if ok else None


def capacity_contiguous(
    aggs: Sequence[Dict[str, object]], ttfa_p95_ms: float = 100.0, underrun_pct: float = 1.0
) -> Optional[float]:
    """The highest offered rate such that it and every lower tested rate pass. None: the lowest
    tested rate failed (or none was tested)."""
    best = None
    for rate, ok in sorted(_rates_passing(aggs, ttfa_p95_ms, underrun_pct).items()):
        if not ok:
            break
        best = rate
    return best


def capacity_result(
    aggs: Sequence[Dict[str, object]], ttfa_p95_ms: float = 100.0, underrun_pct: float = 1.0
) -> Dict[str, object]:
    """The capacity keys of the JSON result (None = no tested rate passed / the lowest failed)."""
    return {
        "capacity_rps": capacity(aggs, ttfa_p95_ms, underrun_pct),
        "capacity_rps_contiguous": capacity_contiguous(aggs, ttfa_p95_ms, underrun_pct),
        "capacity_ttfa_p95_ms": ttfa_p95_ms,
        "capacity_underrun_pct": underrun_pct,
    }


def capacity_line(aggs: Sequence[Dict[str, object]], ttfa_p95_ms: float = 100.0, underrun_pct: float = 1.0) -> str:
    """The ``capacity:`` line printed after an open-loop table."""
    crit = (
        f"the highest offered rate with TTFA p95 <= {ttfa_p95_ms:g} ms, < {underrun_pct:g} % of requests "
        "underrunning and none failed"
    )
    cap = capacity(aggs, ttfa_p95_ms, underrun_pct)
    cont = capacity_contiguous(aggs, ttfa_p95_ms, underrun_pct)
    misses = [
        f"{float(agg['level']):g} ({', '.join(w)})"
        for agg in sorted(aggs, key=lambda g: float(g["level"]))
        if (w := capacity_misses(agg, ttfa_p95_ms, underrun_pct))
    ]
    if cap is None:
        line = f"capacity: none: no tested rate passed ({crit})"
    else:
        line = (
            f"capacity: {cap:g} req/s ({crit}); contiguous "
            f"{'none (the lowest rate failed)' if cont is None else f'{cont:g} req/s'} (it and every lower rate pass)"
        )
    return line + (f"; failing: {'; '.join(misses)}" if misses else "")


def table_row(agg: Dict[str, object]) -> str:
    t, lat, rtf = agg["ttfa"], agg["latency"], agg["rtf"]
    lvl = agg["level"]
    lvl_s = f"{lvl:g}" if isinstance(lvl, (int, float)) else str(lvl)
    return "{:>7} {:>5} {:>4} {:>7} {:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6} {:>9}".format(
        lvl_s,
        agg["ok"],
        agg["failures"],
        _f(agg["req_per_s"]),
        _f(agg["audio_s_per_s"]),
        _ms(t["mean"]),
        _ms(t["p50"]),
        _ms(t["p95"]),
        _ms(t["p99"]),
        _ms(lat["p50"]),
        _ms(lat["p95"]),
        _f(rtf["p50"], "{:.3f}"),
        _f(underrun_pct(agg), "{:.1f}%"),
    )


def print_table(aggs: Sequence[Dict[str, object]], mode: str, file=sys.stdout) -> None:
    unit = "concurrency" if mode == "closed" else "rate req/s"
    print(
        f"\n{mode} loop; level = {unit}; ttfa/latency in ms; percentiles: numpy linear; "
        "underrun = % of the successful requests with a playback underrun",
        file=file,
    )
    print(TABLE_HEAD, file=file)
    print(TABLE_HEAD2, file=file)
    for agg in aggs:
        print(table_row(agg), file=file)
        if agg["failure_codes"]:
            print(f"{'':>7} failures: {agg['failure_codes']}", file=file)
        if agg.get("not_drained"):
            print(
                f"{'':>7} did NOT drain: {agg['not_drained']} request(s) still in flight at the end of the "
                f"drain wait were cancelled",
                file=file,
            )


def write_plot(aggs: Sequence[Dict[str, object]], mode: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    groups: Dict[str, List[Dict[str, object]]] = {}
    for agg in aggs:  # one series per --voice-cache pass (Base), else one
        groups.setdefault(str(agg.get("voice_cache", "")), []).append(agg)
    for name, group in groups.items():
        xs = [agg["level"] for agg in group]
        tag = f"{name}: " if name else ""
        for key, style in (("p50", "o-"), ("p95", "s--")):
            ys = [(agg["ttfa"][key] * 1000 if agg["ttfa"][key] is not None else float("nan")) for agg in group]
            ax1.plot(xs, ys, style, label=f"{tag}TTFA {key}")
        ax2.plot(
            xs,
            [agg["audio_s_per_s"] if agg["audio_s_per_s"] is not None else float("nan") for agg in group],
            "o-",
            label=name or None,
        )
    ax1.set_ylabel("time to first audio (ms)")
    if len(groups) > 1:
        ax2.legend()
    ax2.set_ylabel("audio seconds per wall second")
    for ax in (ax1, ax2):
        ax.set_xlabel("concurrency" if mode == "closed" else "arrival rate (req/s)")
        ax.grid(True, alpha=0.3)
    ax1.legend()
    fig.suptitle(f"triton-qwen3-tts service benchmark ({mode} loop)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_csv(aggs: Sequence[Dict[str, object]], path: str) -> None:
    rows = [bm.flat_level_row(agg) for agg in aggs]
    cols: List[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def voice_cache_inputs(base_kw: Dict[str, object], which: str, shared_id: str) -> Dict[str, object]:
    """Per-request constant inputs for one --voice-cache pass (``base_kw`` holds the reference)."""
    if which == "fresh":
        return dict(base_kw, _fresh_voice_id=True)
    if which == "shared":  # the voice is stored beforehand: send its id alone
        return {k: v for k, v in base_kw.items() if k not in ("ref_audio", "ref_sample_rate", "ref_text")} | {
            "voice_id": shared_id
        }
    return base_kw


def store_voice(
    client_factory: Callable[[], object], base_kw: Dict[str, object], voice_id: str, timeout: float
) -> float:
    """One request that stores the reference under ``voice_id``; returns its latency (s)."""
    from triton_qwen3_tts.tools.client import build_inputs

    kw = dict(base_kw, voice_id=voice_id, text="Store this voice.", max_frames=2, ignore_eos=True)
    c = client_factory()
    try:
        t0 = time.perf_counter()
        c.receive(c.send(build_inputs(**kw)), t0, timeout)
        return time.perf_counter() - t0
    finally:
        c.close()


def run(
    a: argparse.Namespace, client_factory: Optional[Callable[[], object]] = None, out=sys.stdout
) -> Dict[str, object]:
    """Run the sweep (twice with ``--voice-cache both``); return the JSON-able result.
    ``client_factory`` (tests) replaces ``StreamingClient(a.url, a.model)``."""
    if client_factory is None:
        from triton_qwen3_tts.tools.client import StreamingClient

        def client_factory():
            return StreamingClient(a.url, a.model)

    ref = read_ref_audio(a.ref_audio) if a.ref_audio else None
    base_kw = request_inputs(a, ref)
    passes = {"both": ["fresh", "shared"], "off": ["off"]}.get(a.voice_cache, [a.voice_cache])
    if passes == ["off"]:
        return _sweep(a, client_factory, base_kw, out)
    results = {}
    shared_id = f"bench-shared-{uuid.uuid4().hex[:8]}"
    for which in passes:
        print(
            f"\nvoice cache: {which} "
            f"({'a new voice_id with the reference per request: both encoders run every time' if which == 'fresh' else 'one stored voice_id sent alone: no encoder runs'})",
            file=out,
        )
        if which == "shared":
            store_voice(client_factory, base_kw, shared_id, a.timeout)
        results[which] = _sweep(a, client_factory, voice_cache_inputs(base_kw, which, shared_id), out, write=False)
    aggs = [dict(agg, voice_cache=w) for w, r in results.items() for agg in r["levels"]]
    rows = [dict(row, voice_cache=w) for w, r in results.items() for row in r["requests"]]
    result = dict(results[passes[0]], levels=aggs, requests=rows, voice_cache=passes)
    if result["mode"] == "open" and len(passes) > 1:  # one capacity per pass, not the first pass's alone
        result["capacity_by_voice_cache"] = {
            w: capacity_result(r["levels"], a.capacity_ttfa_p95_ms, a.capacity_underrun_pct) for w, r in results.items()
        }
        for k in ("capacity_rps", "capacity_rps_contiguous"):
            result.pop(k, None)
    if len(passes) == 2:
        print("\nvoice cache comparison (per level): TTFA p50 ms, latency p50 ms", file=out)
        for fa, sa in zip(results["fresh"]["levels"], results["shared"]["levels"]):
            print(
                f"  level {fa['level']:g}: fresh {_ms(fa['ttfa']['p50'])} / {_ms(fa['latency']['p50'])}   "
                f"shared {_ms(sa['ttfa']['p50'])} / {_ms(sa['latency']['p50'])}",
                file=out,
            )
    _write_outputs(a, result, aggs)
    return result


def _write_outputs(a: argparse.Namespace, result: Dict[str, object], aggs: Sequence[Dict[str, object]]) -> None:
    if a.out_json:
        with open(a.out_json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
    if a.out_csv:
        write_csv(aggs, a.out_csv)
    if a.plot:
        write_plot(aggs, result["mode"], a.plot)


def _sweep(
    a: argparse.Namespace,
    client_factory: Callable[[], object],
    base_kw: Dict[str, object],
    out=sys.stdout,
    write: bool = True,
) -> Dict[str, object]:
    texts = load_dataset(a.dataset) if a.dataset else load_texts(a.texts)
    mode = "closed" if a.concurrency else "open"
    levels = list(a.concurrency or a.rate)
    aggs, rows = [], []
    for li, level in enumerate(levels):
        picker = TextPicker(texts, a.seed * 1000 + li, a.language, a.clip_frames_range)
        if a.warmup > 0:
            wl = int(level) if mode == "closed" else max(1, min(a.streams, a.warmup))
            _, _, left = run_closed(
                max(1, min(wl, a.warmup)), a, picker, base_kw, client_factory, a.warmup, None, f"warmup {level:g}"
            )
            if left:
                print(
                    f"level {level:g}: the warm-up did NOT drain: {left} request(s) still in flight "
                    f"{a.drain_timeout:g} s after its last send were cancelled",
                    file=out,
                )
        if mode == "closed":
            count = None if a.duration is not None else a.requests_per_level
            recs, wall, left = run_closed(
                int(level), a, picker, base_kw, client_factory, count, a.duration, f"concurrency {level:g}"
            )
        else:
            count = None if a.duration is not None else a.requests_per_level
            arrivals = poisson_arrivals(float(level), a.seed * 1000 + li, count, a.duration)
            recs, wall, left = run_open(float(level), a, picker, base_kw, client_factory, arrivals, f"rate {level:g}")
        agg = bm.aggregate(recs, wall, level=level, mode=mode)
        # requests cancelled because they were still in flight --drain-timeout s after the last
        # send (print_table says so under the level's row)
        agg["not_drained"] = left
        agg["underrun_pct"] = underrun_pct(agg)  # % of the successful requests (JSON, CSV)
        if mode == "open":
            agg["capacity_pass"] = not capacity_misses(agg, a.capacity_ttfa_p95_ms, a.capacity_underrun_pct)
        aggs.append(agg)
        rows += [
            dict(bm.record_row(r), max_frames=getattr(r, "max_frames", None))
            for r in sorted(recs, key=lambda r: r.t_send)
        ]
        if len(levels) > 1:
            print_table([agg], mode, file=out)
    print_table(aggs, mode, file=out)
    if mode == "open":
        print(capacity_line(aggs, a.capacity_ttfa_p95_ms, a.capacity_underrun_pct), file=out)
    config = {k: v for k, v in vars(a).items()}
    result = {
        "config": config,
        "mode": mode,
        "percentile_method": f"numpy {bm.PERCENTILE_METHOD}",
        "metric_definitions": "triton_qwen3_tts/tools/bench_metrics.py",
        "levels": aggs,
        "requests": rows,
    }
    if mode == "open":
        result.update(capacity_result(aggs, a.capacity_ttfa_p95_ms, a.capacity_underrun_pct))
    if write:
        _write_outputs(a, result, aggs)
    return result


def start_cpu_server(a: argparse.Namespace):
    """``--serve-cpu``: the same CPU deployment as ``scripts/quickstart.sh --cpu`` (repository
    builder + launcher); sets ``a.url`` to the server's gRPC address and returns the server."""
    import socket
    import tempfile

    from triton_qwen3_tts.tools import launcher
    from triton_qwen3_tts.serving.repository import RepositorySettings, build_repository

    work = a.serve_work or tempfile.mkdtemp(prefix="qwen3_tts_bench_")
    os.makedirs(work, exist_ok=True)
    settings = RepositorySettings(
        checkpoint=os.path.abspath(a.serve_cpu),
        codec_backend="python",
        device="cpu",
        max_num_seqs=a.serve_max_num_seqs,
        kv_cache_memory_bytes=64 * 2**20,
        enforce_eager=True,
    )
    repo = build_repository(settings, os.path.join(work, "repo"))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    http, grpc, metrics = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    print(f"starting a CPU server on {a.serve_cpu} (repository and logs in {work})", file=sys.stderr)
    srv = launcher.start_server(repo, http, grpc, metrics, os.path.join(work, "server.log"), ready_timeout=900)
    a.url = srv.grpc_url
    return srv


def main(argv=None) -> int:
    a = parse_args(argv)
    srv = start_cpu_server(a) if a.serve_cpu else None
    try:
        result = run(a)
    finally:
        if srv is not None:
            srv.stop()
    total_fail = sum(agg["failures"] for agg in result["levels"])
    total_ok = sum(agg["ok"] for agg in result["levels"])
    return 0 if total_ok > 0 else (1 if total_fail else 0)


if __name__ == "__main__":
    sys.exit(main())
