"""Find the Python-backend stub processes of a Triton server and tell when one has died.

Triton's Python backend runs each model instance in a ``triton_python_backend_stub`` process,
a child of ``tritonserver``, started as
``STUB MODEL_DIR/VERSION/model.py SHM_REGION SHM_SIZE SHM_GROWTH PARENT_PID PYTHON_LIB IPC_HANDLE
INSTANCE_NAME RUNTIME_MODELDIR`` (``python_backend/src/stub_launcher.cc``,
https://github.com/triton-inference-server/python_backend). Triton 2.51 does not restart a stub of
a decoupled model that died: it stays a zombie, every request already inside it waits for ever,
new ones fail with "Stub process '...' is not healthy", and the server still reports ready. So the
``tts`` model watches its peers (``talker``, the codec) and the launcher watches every stub of its
server, both through this module (Linux ``/proc``; elsewhere nothing is found and nothing is
reported dead).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, NamedTuple, Optional

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str  # the model's folder name in the repository
    instance: str  # Triton's instance name, e.g. talker_0_0
    parent_pid: int


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def parse_stub_cmdline(pid: int, cmdline: bytes) -> Optional[Stub]:
    """A :class:`Stub` from ``/proc/PID/cmdline`` (NUL-separated), or None for another process."""
    argv = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a]
    if len(argv) < 9 or os.path.basename(argv[0]) != STUB_NAME:
        return None
    parts = argv[1].replace("\\", "/").split("/")  # .../MODEL/VERSION/model.py
    if len(parts) < 3:
        return None
    if argv[8] == parts[-3]:
        # Triton names the short-lived stub that auto-completes a model's config after the model
        # (instances are MODEL_GROUP_INDEX): it exits by design, so it is not watched
        return None
    try:
        parent = int(argv[5])
    except ValueError:
        parent = -1
    return Stub(pid=pid, model=parts[-3], instance=argv[8], parent_pid=parent)


_GONE = (b"Z", b"X")  # /proc states of a process that has died (a zombie not reaped, or dead)


def pids(proc: str = "/proc") -> List[int]:
    """Every process id under ``proc``."""
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


class ProcStat(NamedTuple):
    """What ``/proc/PID/stat`` says of a process (proc(5))."""

    comm: str  # the process name, as /proc/PID/comm
    state: bytes  # R, S, D, Z, X, ...
    ppid: int
    cpu_s: Optional[float]  # user + system CPU seconds so far; None when the line stops short


def proc_stat(pid: int, proc: str = "/proc") -> Optional[ProcStat]:
    """:class:`ProcStat` of ``pid``, or None when it is gone or its stat line does not parse."""
    stat = _read(f"{proc}/{pid}/stat")
    if stat is None:
        return None
    # the name (field 2) is in parentheses and may hold spaces and parentheses: split after the last ')'
    lp, rp = stat.find(b"("), stat.rfind(b")")
    rest = stat[rp + 2 :].split()
    if lp < 0 or len(rest) < 2:
        return None
    try:
        cpu = (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK") if len(rest) > 12 else None
        return ProcStat(stat[lp + 1 : rp].decode("utf-8", "replace"), rest[0], int(rest[1]), cpu)
    except ValueError:
        return None


def cmdline(pid: int, proc: str = "/proc") -> str:
    """``pid``'s command line, its arguments joined by spaces ("" when it is gone)."""
    raw = _read(f"{proc}/{pid}/cmdline")
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip() if raw else ""


def is_alive(pid: int, proc: str = "/proc") -> bool:
    """True while ``pid`` exists and is not a zombie (a dead stub its parent has not reaped)."""
    f = proc_stat(pid, proc)
    return f is not None and f.state not in _GONE


def find_stubs(
    parent_pid: Optional[int] = None, models: Optional[Iterable[str]] = None, proc: str = "/proc"
) -> List[Stub]:
    """Live stub processes, optionally only those of the server ``parent_pid`` and of ``models``;
    processes forked by a stub, which share its command line, are not stubs."""
    wanted = None if models is None else set(models)
    out = []
    for pid in pids(proc):
        raw = _read(f"{proc}/{pid}/cmdline")
        stub = parse_stub_cmdline(pid, raw) if raw else None
        if stub is None:
            continue
        if parent_pid is not None and stub.parent_pid != parent_pid:
            continue
        if wanted is not None and stub.model not in wanted:
            continue
        # The server forks each stub itself and the stub keeps that pid (``bash -c "exec STUB ..."``),
        # so a stub's parent is the server it names. A process the stub forks (torch, vLLM,
        # multiprocessing) carries the stub's command line until it execs; its parent is the stub,
        # or init once the stub is gone: not a stub, and its exit is no stub's death.
        f = proc_stat(pid, proc)
        if f is not None and f.state not in _GONE and f.ppid == stub.parent_pid:
            out.append(stub)
    return sorted(out, key=lambda s: (s.instance, s.pid))


# The process name (``/proc/PID/comm``) an engine worker of the tts gives itself
# (serving/talker/worker.py, pipeline fused: one process per GPU), followed by its GPU's index.
WORKER_COMM_PREFIX = "qwen3tts-gpu"


def find_workers(stubs: Iterable[Stub], proc: str = "/proc") -> List[Stub]:
    """The live engine worker processes (children of ``stubs`` named ``WORKER_COMM_PREFIX``N), each as
    a :class:`Stub` of its stub's model, instance ``<stub instance> gpu N engine``."""
    by_pid = {s.pid: s for s in stubs}
    out = []
    for pid in pids(proc) if by_pid else []:
        f = proc_stat(pid, proc)
        if f is None or not f.comm.startswith(WORKER_COMM_PREFIX) or f.ppid not in by_pid or f.state in _GONE:
            continue
        stub = by_pid[f.ppid]
        gpu = f.comm[len(WORKER_COMM_PREFIX) :]
        out.append(Stub(pid=pid, model=stub.model, instance=f"{stub.instance} gpu {gpu} engine", parent_pid=stub.pid))
    return sorted(out, key=lambda s: (s.instance, s.pid))


def find_stubs_and_workers(
    parent_pid: Optional[int] = None, models: Optional[Iterable[str]] = None, proc: str = "/proc"
) -> List[Stub]:
    """:func:`find_stubs` and their engine workers (:func:`find_workers`): every process whose
    death leaves a model unable to serve."""
    stubs = find_stubs(parent_pid, models, proc)
    return stubs + find_workers(stubs, proc)


class StubWatch:
    """Remembers every stub it has seen alive and reports the ones that have died since.

    ``poll()`` looks again: new stubs are added (models load in any order), and each stub seen
    before that is no longer alive is returned once. ``find`` and ``alive`` are injectable for
    tests."""

    def __init__(
        self, parent_pid: Optional[int], models: Optional[Iterable[str]] = None, find=find_stubs, alive=is_alive
    ):
        self.parent_pid = parent_pid
        self.models = None if models is None else tuple(models)
        self._find, self._alive = find, alive
        self.seen: Dict[int, Stub] = {}

    def poll(self) -> List[Stub]:
        dead = [s for pid, s in self.seen.items() if not self._alive(pid)]
        for s in dead:
            del self.seen[s.pid]
        for s in self._find(self.parent_pid, self.models):
            self.seen.setdefault(s.pid, s)
        return dead
