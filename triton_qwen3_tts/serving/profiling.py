"""Wall-clock stack sampling inside the Triton Python stubs (diagnostics; off unless asked for).

Set ``QWEN3_TTS_PROFILE_DIR=/some/dir`` in tritonserver's environment and every model that calls
:func:`maybe_start` (``tts``, ``talker``, the Python codecs) writes ``<dir>/<model>-<pid>.json``
every few seconds and when it is unloaded. The file says, per Python thread, how many CPU seconds
it used (``time.pthread_getcpuclockid``) and where it stood when sampled (the innermost frames,
counted), plus the process's CPU seconds and wall seconds, and named timings that the model
records (:func:`timing`, e.g. each codec call as the tts sees it). A process whose CPU seconds
approach its wall seconds while the GPU waits is bound by its Python work (one GIL).

Why a sampler of our own rather than py-spy or yappi: py-spy attaches with ptrace, which the GPU
machine's sandbox refuses to non-root users and which a stub cannot do to itself; yappi and
cProfile hook every call, which slows an IPC-bound service enough to change what is measured.
Reading every thread's stack every few milliseconds from a daemon thread (``faulthandler``'s dump,
see :class:`_Snapshot`) needs nothing installed and costs a few per cent of one core (6 % in the
H100 run's tts stub, 30 threads sampled every 5 ms, with the earlier Python frame walk; raise
``QWEN3_TTS_PROFILE_INTERVAL_MS`` to pay less). ``python scripts/profile_report.py DIR``
prints the files as tables.
"""

from __future__ import annotations

import collections
import faulthandler
import json
import os
import re
import tempfile
import threading
import time
from typing import Dict, List, Optional

ENV_DIR = "QWEN3_TTS_PROFILE_DIR"
ENV_INTERVAL = "QWEN3_TTS_PROFILE_INTERVAL_MS"


_FRAME_LINE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD_LINE = re.compile(r"^(?:Current thread|Thread) (?P<ident>0x[0-9a-f]+)")


def _label(filename: str, func: str, line: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{func}:{line}"


def _parse_dump(text: str) -> Dict[int, List[str]]:
    """``faulthandler.dump_traceback(all_threads=True)`` output -> {thread ident: frame labels,
    innermost first}."""
    out: Dict[int, List[str]] = {}
    current: Optional[List[str]] = None
    for line in text.splitlines():
        t = _THREAD_LINE.match(line)
        if t:
            current = out.setdefault(int(t.group("ident"), 16), [])
            continue
        f = _FRAME_LINE.match(line)
        if f and current is not None:
            current.append(_label(f.group("file"), f.group("func"), f.group("line")))
    return out


class _Snapshot:
    """Every thread's stack, read by faulthandler in C while this thread holds the GIL.

    Walking other threads' frames from Python (``sys._current_frames()`` then ``f_back``) is not
    safe in CPython 3.11: this thread may lose the GIL between two bytecodes, the other thread then
    returns from a frame, and ``f_back`` reads freed memory (a segfault seen in a stub under load).
    faulthandler's dump reads the frames without running Python code, so it cannot be interrupted.
    """

    def __init__(self):
        self._file = tempfile.TemporaryFile(mode="w+b")

    def take(self) -> Dict[int, List[str]]:
        f = self._file
        f.seek(0)
        f.truncate()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.flush()
        f.seek(0)
        return _parse_dump(f.read().decode("utf-8", "replace"))

    def close(self) -> None:
        self._file.close()


class _Timing:
    __slots__ = ("count", "total", "samples")

    def __init__(self):
        self.count, self.total, self.samples = 0, 0.0, collections.deque(maxlen=4096)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.samples.append(seconds)

    def summary(self) -> Dict[str, float]:
        xs = sorted(self.samples)

        def pct(p):
            return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None

        return {
            "count": self.count,
            "mean_s": self.total / self.count if self.count else None,
            "p50_s": pct(0.50),
            "p95_s": pct(0.95),
            "p99_s": pct(0.99),
        }


class StackSampler:
    """Samples every thread's stack every ``interval`` seconds from a daemon thread."""

    def __init__(
        self, name: str, out_dir: str, interval: float = 0.005, depth: int = 4, top: int = 12, flush_every: float = 5.0
    ):
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        self.name, self.out_dir, self.interval, self.depth, self.top = name, out_dir, interval, depth, top
        self.flush_every = flush_every
        self.path = os.path.join(out_dir, f"{name}-{os.getpid()}.json")
        self._counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self._samples: collections.Counter = collections.Counter()
        self._timings: Dict[str, _Timing] = {}
        self._cpu_seen: Dict[int, tuple] = {}  # thread ident -> (name, last CPU seconds read)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = self._cpu0 = 0.0
        self._snapshot: Optional[_Snapshot] = None

    # -- recording -------------------------------------------------------------------------
    def timing(self, key: str, seconds: float) -> None:
        with self._lock:
            t = self._timings.get(key)
            if t is None:
                t = self._timings[key] = _Timing()
            t.add(float(seconds))

    def sample_once(self) -> None:
        me = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        if self._snapshot is None:
            self._snapshot = _Snapshot()
        stacks = self._snapshot.take()
        with self._lock:
            for ident, labels in stacks.items():
                if ident == me:
                    continue
                tname = names.get(ident, f"thread-{ident}")
                self._samples[tname] += 1
                self._counts[tname][" <- ".join(labels[: self.depth])] += 1

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "StackSampler":
        os.makedirs(self.out_dir, exist_ok=True)
        self._t0, self._cpu0 = time.monotonic(), time.process_time()
        self._thread = threading.Thread(target=self._run, name=f"profiler-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_every
        while not self._stop.wait(self.interval):
            self.sample_once()
            if time.monotonic() >= next_flush:
                self.write()
                next_flush = time.monotonic() + self.flush_every

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.write()
        if self._snapshot is not None and not (self._thread is not None and self._thread.is_alive()):
            self._snapshot.close()
            self._snapshot = None

    # -- report ----------------------------------------------------------------------------
    def report(self) -> Dict[str, object]:
        # A thread's CPU clock can only be read while it lives: keep the last reading of each, so
        # threads that stopped before the final write (the event loop at unload) still count.
        for t in threading.enumerate():
            try:
                self._cpu_seen[t.ident] = (t.name, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
            except (OSError, AttributeError, TypeError, OverflowError):  # exited, or not on this OS
                pass
        threads: Dict[str, Dict[str, object]] = {}
        for name, cpu in self._cpu_seen.values():
            entry = threads.setdefault(name, {"cpu_s": 0.0, "threads": 0})
            entry["threads"] += 1
            entry["cpu_s"] += cpu
        with self._lock:
            for tname, n in self._samples.items():
                entry = threads.setdefault(tname, {"cpu_s": None, "threads": 0})
                entry["samples"] = n
                entry["top"] = self._counts[tname].most_common(self.top)
            timings = {k: v.summary() for k, v in self._timings.items()}
        return {
            "name": self.name,
            "pid": os.getpid(),
            "interval_s": self.interval,
            "wall_s": time.monotonic() - self._t0,
            "process_cpu_s": time.process_time() - self._cpu0,
            "threads": threads,
            "timings": timings,
        }

    def write(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.report(), f, indent=1)
        os.replace(tmp, self.path)


_active: Optional[StackSampler] = None


def maybe_start(name: str) -> Optional[StackSampler]:
    """Start the process's sampler if ``QWEN3_TTS_PROFILE_DIR`` is set (once per process)."""
    global _active
    out_dir = os.environ.get(ENV_DIR, "").strip()
    if not out_dir or _active is not None:
        return _active
    interval_ms = float(os.environ.get(ENV_INTERVAL, "5"))
    _active = StackSampler(name, out_dir, interval=interval_ms / 1000.0).start()
    return _active


def timing(key: str, seconds: float) -> None:
    """Record a named duration in the active sampler; nothing when profiling is off."""
    if _active is not None:
        _active.timing(key, seconds)


def stop() -> None:
    global _active
    if _active is not None:
        _active.stop()
        _active = None
