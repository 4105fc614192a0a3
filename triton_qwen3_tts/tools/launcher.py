"""Start, wait for and stop a Triton Inference Server on a model repository.

Two kinds of server are supported:

* **image**: a Triton release image (``/opt/tritonserver/bin/tritonserver`` or ``tritonserver`` on
  PATH with its own backends directory): used as is.
* **wheel**: the ``tritonserver`` 2.51.0 binary shipped inside the ``nvidia-pytriton`` wheel (Python
  backend only; ``scripts/setup_env.sh`` installs it, docs/environment.md). It needs the
  Python-backend stub of this interpreter's version copied next to the backend library, the wheel's
  bundled libraries and the interpreter's ``libpython`` on ``LD_LIBRARY_PATH``, and the venv's
  ``bin`` first on ``PATH`` (the stub embeds libpython and finds the venv's site-packages through
  the ``python3`` it sees on PATH); :func:`server_command` does all of it.

Process hygiene: the server is started in its own process group (``setsid``), bound to
127.0.0.1 unless told otherwise, stopped with SIGTERM then SIGKILL on the whole group, and the
Python backend's shared-memory files that a killed stub leaves behind are removed.

Supervision: Triton 2.51 does not restart a Python-backend stub of a decoupled model that died
(``stub_procs``); the server would keep reporting ready while every request to that model fails.
While it runs, the launcher watches every stub of its server and, when one dies, waits
``RESTART_GRACE_S`` (the ``tts`` model fails its requests in flight meanwhile), stops the server
and starts it again (``--max-restarts``, default 5; ``--max-restarts 0`` exits with status 3
instead, for an orchestrator that restarts containers). Readiness is false while it restarts.

Gateway: unless ``--gateway-port 0``, the launcher also starts the OpenAI-compatible HTTP gateway
(``qwen3-tts-gateway``, :mod:`triton_qwen3_tts.gateway`) on ``--gateway-port`` (default 8080),
pointed at the server's gRPC port, in its own process group; it keeps running while the server
restarts (its ``/ready`` says so) and is stopped with the server. If it dies, the launcher stops
the server and exits with status 4.

Usage: ``qwen3-tts-serve --model-repository DIR [--http-port 8000 ...]`` (the same as ``python -m
triton_qwen3_tts.tools.launcher``): prints progress while it waits for readiness, then serves until
interrupted. If the server fails to start, it prints the log lines that carry the cause.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from typing import List, Optional

from triton_qwen3_tts.engines.vllm.engine import CACHE_ENV, cache_root
from triton_qwen3_tts.serving.stub_procs import StubWatch, find_stubs_and_workers

IMAGE_SERVER = "/opt/tritonserver/bin/tritonserver"
IMAGE_BACKENDS = "/opt/tritonserver/backends"
RESTART_GRACE_S = 2.0  # after a stub died: time for the tts model to fail its requests in flight
EXIT_STUB_DIED = 3
EXIT_GATEWAY_DIED = 4
GATEWAY_MODULES = ("fastapi", "uvicorn", "multipart", "av", "soxr")  # requirements/cpu-3-serving.txt


class LaunchError(RuntimeError):
    pass


@dataclass
class ServerCommand:
    argv: List[str]
    env: dict
    kind: str  # "image" | "wheel"


def _wheel_root() -> Optional[str]:
    try:
        import pytriton  # noqa: F401  (the nvidia-pytriton wheel)
    except Exception:
        return None
    purelib = sysconfig.get_paths()["purelib"]
    root = os.path.join(purelib, "pytriton", "tritonserver")
    return root if os.path.exists(os.path.join(root, "bin", "tritonserver")) else None


def _prepare_wheel_backends(root: str, workdir: str) -> str:
    """Copy the wheel's backends dir and the stub for this Python into ``workdir``; return it."""
    pyv = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub_src = os.path.join(root, "python_backend_stubs", pyv, "triton_python_backend_stub")
    if not os.path.exists(stub_src):
        raise LaunchError(f"nvidia-pytriton has no Python backend stub for Python {pyv}")
    backends = os.path.join(workdir, "backends")
    stub_dst = os.path.join(backends, "python", "triton_python_backend_stub")
    if not os.path.exists(stub_dst):
        os.makedirs(workdir, exist_ok=True)
        shutil.copytree(os.path.join(root, "backends"), backends, dirs_exist_ok=True)
        shutil.copy2(stub_src, stub_dst)
        os.chmod(stub_dst, 0o755)
    return backends


def server_command(
    model_repository: str,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    address: str = "127.0.0.1",
    extra_args: Optional[List[str]] = None,
    workdir: Optional[str] = None,
    prefer: str = "auto",
) -> ServerCommand:
    """Build the tritonserver command line and environment (nothing is started)."""
    if prefer not in ("auto", "image", "wheel"):
        raise LaunchError(f"prefer must be auto, image or wheel, got {prefer!r}")
    repo = os.path.abspath(model_repository)
    if not os.path.isdir(repo):
        raise LaunchError(f"model repository {repo} does not exist")
    env = dict(os.environ)
    common = [
        f"--model-repository={repo}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        f"--http-address={address}",
        f"--grpc-address={address}",
        f"--metrics-address={address}",
        "--allow-gpu-metrics=false",
        "--log-verbose=0",
    ] + list(extra_args or [])
    image_bin = IMAGE_SERVER if os.path.exists(IMAGE_SERVER) else None
    if prefer in ("auto", "image") and image_bin:
        return ServerCommand([image_bin, f"--backend-directory={IMAGE_BACKENDS}"] + common, env, "image")
    root = _wheel_root()
    if root is None:
        if prefer == "image":
            raise LaunchError(f"no Triton image server at {IMAGE_SERVER}")
        raise LaunchError(
            "no tritonserver found: neither a Triton image (/opt/tritonserver) nor the "
            "nvidia-pytriton wheel is installed (run scripts/setup_env.sh)"
        )
    workdir = workdir or os.environ.get("QWEN3_TTS_TRITON_WORKDIR", "/tmp/triton_qwen3_tts_backends")
    backends = _prepare_wheel_backends(root, workdir)
    purelib = sysconfig.get_paths()["purelib"]
    libs = [os.path.join(purelib, "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return ServerCommand(
        [os.path.join(root, "bin", "tritonserver"), f"--backend-directory={backends}"] + common, env, "wheel"
    )


def _answers(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


# wait_ready: how long a ready server's metrics service may take to answer before the server
# counts as ready without it (a taken metrics port makes tritonserver exit about a second after
# it answered ready)
METRICS_GRACE_S = 15.0


@dataclass
class TritonServer:
    """A running tritonserver process group. Use as a context manager or call ``stop()``."""

    command: ServerCommand
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: str
    proc: Optional[subprocess.Popen] = None
    _log: object = field(default=None, repr=False)
    _log_start: int = 0  # where this start's lines begin in the log (it is appended to)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> "TritonServer":
        # A stale server on our ports would answer the readiness probe in our place.
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            if _port_in_use(port):
                raise LaunchError(f"port {port} is already in use (another tritonserver still running?)")
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        self.proc = subprocess.Popen(
            self.command.argv,
            env=self.command.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def is_ready(self) -> bool:
        return _answers(f"http://{self.http_url}/v2/health/ready")

    def _flag(self, name: str) -> Optional[str]:
        """The last value of tritonserver flag ``--name`` on the command line (``--name=v`` or
        ``--name v``), or None."""
        argv, value = self.command.argv, None
        for k, a in enumerate(argv):
            if a.startswith(f"--{name}="):
                value = a.split("=", 1)[1]
            elif a == f"--{name}" and k + 1 < len(argv):
                value = argv[k + 1]
        return value

    def metrics_up(self) -> bool:
        """Whether the metrics service answers (on the port the command line gives it last)."""
        return _answers(f"http://127.0.0.1:{self._flag('metrics-port') or self.metrics_port}/metrics")

    def _metrics_on(self) -> bool:
        return (self._flag("allow-metrics") or "true").strip().lower() not in ("false", "off", "0", "no")

    def wait_ready(self, timeout: float = 300.0, progress=None, every: float = 10.0, cancelled=None) -> None:
        """Block until the server answers ready and its metrics service answers too: tritonserver
        answers ready before it starts that service, and exits when its port is taken. A server
        whose metrics do not answer within ``METRICS_GRACE_S`` of its readiness (metrics off by a
        flag this does not read, an address this host cannot reach) counts as ready all the same.
        ``progress(seconds)`` is called every ``every`` seconds meanwhile. Raises
        :class:`LaunchError` with the log lines that carry the cause (:meth:`log_causes`) when
        the server exits first or ``timeout`` passes, and at once when ``cancelled()`` turns
        true."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        next_note = t0 + every
        ready_at = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise LaunchError(
                    f"tritonserver exited with code {self.proc.returncode} before it was ready; {self.log_causes()}"
                )
            if self.is_ready():
                ready_at = time.monotonic() if ready_at is None else ready_at
                if not self._metrics_on() or self.metrics_up() or time.monotonic() - ready_at >= METRICS_GRACE_S:
                    return
            if cancelled is not None and cancelled():
                raise LaunchError("stopped before the server was ready")
            now = time.monotonic()
            if progress is not None and now >= next_note:
                progress(now - t0)
                next_note = now + every
            time.sleep(0.5)
        raise LaunchError(f"tritonserver not ready after {timeout:.0f} s; {self.log_causes()}")

    def log_causes(self, max_lines: int = 60) -> str:
        """The lines this start wrote to the server log that say what went wrong (see
        :func:`error_lines`), or the log's tail when none does; with the log's path."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return f"no log at {self.log_path}"
        lines = error_lines(text, max_lines)
        if lines:
            return f"the log's error lines ({self.log_path}):\n" + "\n".join(lines)
        return f"no error line in the log; its tail ({self.log_path}):\n{self.log_tail(30)}"

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 8.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # Stubs of a server that died ignore SIGTERM: kill the whole group.
        _signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if self._log is not None:
            self._log.close()
        cleanup_shm()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# A Triton log line: severity letter, MMDD, time, ... ("E1125 00:47:12.123456 123 model_lifecycle.cc:...]")
_TRITON_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
_TRITON_ERROR = re.compile(r"^[EF]\d{4} \d\d:\d\d:\d\d")
_ERROR_WORDS = re.compile(r"\b(error|failed|failure|fatal|exception|traceback|unavailable|killed)\b", re.I)
# error lines every CPU start has, whatever goes wrong
_HARMLESS = ("CudaDriverHelper has not been initialized",)


def error_lines(text: str, max_lines: int = 60, follow: int = 12) -> List[str]:
    """The lines of a tritonserver log that carry a failure's cause: Triton's error lines (``E1125
    ...``), other lines naming an error, a failure or a traceback, each with up to ``follow`` lines
    that continue its message (a Python traceback inside a model's load error); at most
    ``max_lines``, the last ones when there are more."""
    lines = [line.rstrip() for line in text.splitlines()]
    keep: List[int] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if (_TRITON_ERROR.match(line) or _ERROR_WORDS.search(line)) and not any(h in line for h in _HARMLESS):
            keep.append(i)
            j = i + 1
            while j < len(lines) and j <= i + follow and not _TRITON_LINE.match(lines[j]):
                keep.append(j)
                j += 1
            i = j
        else:
            i += 1
    out = [lines[k] for k in keep]
    if len(out) > max_lines:
        out = [f"... ({len(out) - max_lines} earlier lines left out)"] + out[-max_lines:]
    return out


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def cleanup_shm() -> None:
    """Remove Python-backend shared-memory regions whose owners are gone."""
    for path in glob.glob("/dev/shm/triton_python_backend_shm_region_*"):
        try:
            # A region still mapped by a live process stays; an orphan is safe to remove.
            if not _in_use(path):
                os.remove(path)
        except OSError:
            pass


def _in_use(path: str) -> bool:
    target = os.path.realpath(path)
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps, "r", errors="replace") as f:
                if target in f.read():
                    return True
        except OSError:
            continue
    return False


def start_server(
    model_repository: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    log_path: str,
    extra_args=None,
    ready_timeout: float = 300.0,
    **kw,
) -> TritonServer:
    cmd = server_command(model_repository, http_port, grpc_port, metrics_port, extra_args=extra_args, **kw)
    server = TritonServer(cmd, http_port, grpc_port, metrics_port, log_path).start()
    try:
        server.wait_ready(ready_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def gateway_command(
    grpc_port: int, port: int, address: str = "127.0.0.1", voices_dir: Optional[str] = None, model: str = "tts"
) -> List[str]:
    """The command line of the gateway beside a server on ``grpc_port``."""
    argv = [sys.executable, "-m", "triton_qwen3_tts.gateway.main", "--triton-url", f"127.0.0.1:{grpc_port}"]
    argv += ["--host", address, "--port", str(port), "--model", model]
    if voices_dir:
        argv += ["--voices-dir", voices_dir]
    return argv


def missing_gateway_modules() -> List[str]:
    import importlib.util

    return [m for m in GATEWAY_MODULES if importlib.util.find_spec(m) is None]


class Gateway:
    """The gateway process (its own process group; log appended to ``log_path``)."""

    def __init__(self, argv: List[str], env: dict, log_path: str):
        self.argv, self.env, self.log_path = argv, env, log_path
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Gateway":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 8.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
        except OSError:
            return "(no log)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="qwen3-tts-serve",
        description="Start Triton Inference Server on a model repository (qwen3-tts-build-repository writes one), "
        "wait until it is ready and serve until interrupted; restarts it when a model process dies.",
    )
    p.add_argument("--model-repository", required=True, help="the repository folder")
    p.add_argument("--http-port", type=int, default=8000, help="(default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="(default 8001)")
    p.add_argument("--metrics-port", type=int, default=8002, help="(default 8002)")
    p.add_argument("--address", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 inside containers)")
    p.add_argument("--log", default="tritonserver.log", help="the server's log file (default tritonserver.log)")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for readiness (default 900)")
    p.add_argument(
        "--server",
        choices=["auto", "image", "wheel"],
        default="auto",
        help="auto (default): a Triton image's /opt/tritonserver if present, else the nvidia-pytriton wheel's "
        "tritonserver; image or wheel: only that one",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="the cache folder the models write to (vLLM's derived model folders; default $QWEN3_TTS_CACHE, "
        "else ~/.cache/triton_qwen3_tts)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restart the server this many times when one of its model processes dies "
        "(0: exit with status 3 instead; default 5)",
    )
    p.add_argument(
        "--stop-timeout", type=float, default=8.0, help="seconds a stopping server gets before it is killed (default 8)"
    )
    p.add_argument(
        "--gateway-port",
        type=int,
        default=8080,
        help="port of the OpenAI-compatible HTTP gateway (/v1/audio/speech; default 8080; 0: no gateway)",
    )
    p.add_argument(
        "--voices-dir",
        default=None,
        help="the gateway's voice store (default $QWEN3_TTS_CACHE/voices, else ~/.cache/triton_qwen3_tts/voices)",
    )
    p.add_argument("--gateway-log", default="gateway.log", help="the gateway's log file (default gateway.log)")
    p.add_argument("extra", nargs="*", help="extra tritonserver arguments (after --)")
    a = p.parse_args(argv)
    gateway = None
    if a.gateway_port:
        missing = missing_gateway_modules()
        if missing:
            print(
                f"error: the gateway needs {', '.join(missing)} (pip install -r requirements/cpu-3-serving.txt, "
                "or 'triton-qwen3-tts[gateway]'); or pass --gateway-port 0",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if _port_in_use(a.gateway_port):
            print(f"error: gateway port {a.gateway_port} is already in use", file=sys.stderr, flush=True)
            return 1
    try:
        cmd = server_command(
            a.model_repository, a.http_port, a.grpc_port, a.metrics_port, a.address, a.extra, prefer=a.server
        )
        cache = os.path.abspath(os.path.expanduser(a.cache_dir)) if a.cache_dir else str(cache_root())
        cmd.env[CACHE_ENV] = cache
        server = TritonServer(cmd, a.http_port, a.grpc_port, a.metrics_port, a.log).start()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"tritonserver ({cmd.kind}) starting; log: {os.path.abspath(a.log)}; cache: {cache}", flush=True)
    if a.gateway_port:
        voices = os.path.abspath(os.path.expanduser(a.voices_dir)) if a.voices_dir else os.path.join(cache, "voices")
        genv = dict(os.environ, **{CACHE_ENV: cache})
        gateway = Gateway(gateway_command(a.grpc_port, a.gateway_port, a.address, voices), genv, a.gateway_log)
        gateway.start()
        print(
            f"gateway starting on {a.address}:{a.gateway_port}; log: {os.path.abspath(a.gateway_log)}; voices: {voices}",
            flush=True,
        )
    stop = {"flag": False}

    def _on_signal(signum, frame):
        stop["flag"] = True

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    restarts = 0

    def waiting(seconds: float) -> None:
        print(f"still waiting for the server to be ready: {seconds:.0f} s (log: {a.log})", flush=True)

    try:
        while True:
            try:
                server.wait_ready(a.ready_timeout, progress=waiting, cancelled=lambda: stop["flag"])
            except LaunchError as e:
                if stop["flag"]:
                    return 0
                print(f"error: {e}", file=sys.stderr, flush=True)
                return 1
            gw = f", gateway http://127.0.0.1:{a.gateway_port}/v1" if gateway else ""
            print(f"ready: grpc {server.grpc_url}, http {server.http_url}, metrics :{a.metrics_port}{gw}", flush=True)
            if restarts == 0:
                print(
                    f'try: qwen3-tts-client --url {server.grpc_url} --text "Hello there." --out hello.wav '
                    "(Ctrl-C here stops the server)",
                    flush=True,
                )
            dead = supervise(server, stop, gateway=gateway)
            if gateway is not None and not gateway.alive() and not stop["flag"]:
                print(
                    f"error: the gateway exited ({gateway.proc.returncode}); its log's end:\n{gateway.log_tail()}",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_GATEWAY_DIED
            if not dead:
                break
            names = ", ".join(f"{s.instance} (pid {s.pid})" for s in dead)
            if restarts >= a.max_restarts:
                print(
                    f"error: model process {names} died; not restarting (--max-restarts {a.max_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_STUB_DIED
            restarts += 1
            print(
                f"model process {names} died: restarting the server ({restarts}/{a.max_restarts})",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(RESTART_GRACE_S)
            server.stop(a.stop_timeout)
            server.start()
    finally:
        if gateway is not None:
            gateway.stop(a.stop_timeout)
        server.stop(a.stop_timeout)
    return 0 if stop["flag"] else (server.proc.returncode or 1)


def supervise(server: "TritonServer", stop: dict, interval: float = 0.5, gateway: Optional[Gateway] = None) -> list:
    """Block while the server (and the gateway, if any) runs and ``stop["flag"]`` is unset;
    returns the stubs that died (empty when the server or the gateway exited or a stop was asked
    for)."""
    watch = StubWatch(server.proc.pid, find=find_stubs_and_workers)  # the tts's engine processes too
    while not stop["flag"] and server.proc.poll() is None and (gateway is None or gateway.alive()):
        dead = watch.poll()
        if dead:
            return dead
        time.sleep(interval)
    return []


if __name__ == "__main__":
    sys.exit(main())
