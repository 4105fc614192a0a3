"""Staying up under load and failure (real tritonserver under the project's launcher, CPU, tiny
random checkpoint, native talker engine; each test runs on the split pipeline with the resident
stateful codec as on the GPU, on the fused pipeline, and on the fused pipeline with its engine in a
worker process, ``fused_workers`` process):

* an open-loop burst that saturates the machine: no stub dies, every request ends with audio or a
  coded error, the in-flight and codec-state gauges return to 0;
* (split, fused-worker) a talker that stops answering (SIGSTOP of the talker stub or the engine
  worker): the request fails with UNAVAILABLE naming ``request_deadline_s`` soon after the
  deadline, and serving resumes;
* (split, fused-worker) ``kill -9`` of the talker stub or the engine worker mid-stream: every
  stream in flight gets an error within seconds, the launcher restarts the server, and it serves
  again;
* stopping the server after cancelled requests: done within 10 s, no stub segfaults at exit.
"""

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from system_support import start_on_free_ports

from triton_qwen3_tts.tools.client import StreamingClient, TtsError, build_inputs
from triton_qwen3_tts.tools.launcher import LaunchError
from triton_qwen3_tts.serving.stub_procs import find_stubs_and_workers

pytestmark = pytest.mark.system

DEADLINE_S = 4.0
TEXT = "Staying up is the first thing a speech server must do."


class Supervised:
    """``python -m triton_qwen3_tts.tools.launcher`` on a CPU repository, its output collected."""

    def __init__(self, repo, work, ports):
        self.http, self.grpc, self.metrics_port = ports
        self.log = str(work / "server.log")
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "triton_qwen3_tts.tools.launcher",
                "--model-repository",
                repo,
                "--http-port",
                str(self.http),
                "--grpc-port",
                str(self.grpc),
                "--metrics-port",
                str(self.metrics_port),
                "--log",
                self.log,
                "--max-restarts",
                "2",
                "--gateway-port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc}"

    def ready(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def wait_ready(self, timeout=300):
        """Until the launcher says ready (the server ready, its metrics service up). A launcher
        that exits first raises LaunchError with its last lines (start_on_free_ports retries one
        that lost a port to another process: "already in use")."""
        t = time.time()
        while not any(line.startswith("ready:") for line in self.lines):
            if self.proc.poll() is not None:
                time.sleep(0.5)  # the reader thread's last lines
                taken = [line for line in self.lines if "already in use" in line]  # retried if any
                raise LaunchError(f"launcher exited: {taken} {self.lines[-20:]}")
            assert time.time() - t < timeout, f"not ready after {timeout} s: {self.lines[-20:]}"
            time.sleep(0.5)

    def server_pid(self):
        out = subprocess.run(["pgrep", "-f", f"tritonserver.*--grpc-port={self.grpc}"], capture_output=True, text=True)
        pids = [int(x) for x in out.stdout.split()]
        assert len(pids) == 1, (pids, self.lines[-10:])
        return pids[0]

    def stubs(self):
        """Instance -> pid of the server's stubs and the tts's engine workers."""
        return {s.instance: s.pid for s in find_stubs_and_workers(self.server_pid())}

    def engine_process(self):
        """The pid of the process the talker engine runs in, when that is not the tts's own: the
        talker stub (split) or the engine worker (fused-worker); skips the test on plain fused."""
        if self.pipeline == "fused":
            pytest.skip("pipeline fused (fused_workers thread) has no talker process: the tts hosts the engine")
        want = "talker" if self.pipeline == "split" else "tts_0_0 gpu 0 engine"
        pids = [pid for inst, pid in self.stubs().items() if inst.startswith(want)]
        assert len(pids) == 1, self.stubs()
        return pids[0]

    def metric(self, name):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))

    def wait_gauges_zero(self, timeout=30):
        t = time.time()
        names = ("qwen3_tts_requests_in_flight", "qwen3_tts_codec_states_live", "qwen3_tts_codec_resident_states")
        while any(self.metric(n) for n in names):
            assert time.time() - t < timeout, {n: self.metric(n) for n in names}
            time.sleep(0.2)


@pytest.fixture(scope="module", params=["split", "fused", "fused-worker"])
def server(request, tiny_checkpoint, tmp_path_factory):
    """Both pipelines: split (talker frames into the resident stateful codec) and fused (the tts
    hosts the talker engine, which decodes the audio: one model, one stub); fused-worker: the
    fused pipeline with the engine in a worker process of the tts (``fused_workers`` process)."""
    from triton_qwen3_tts.serving.repository import RepositorySettings, build_repository

    work = tmp_path_factory.mktemp(f"resilience_{request.param}")
    repo = build_repository(
        RepositorySettings(
            checkpoint=str(tiny_checkpoint),
            codec_backend="python",
            device="cpu",
            engine="native",
            codec_mode="stateful",
            max_num_seqs=8,
            max_model_len=0,
            max_text_chars=200,
            default_max_frames=40,
            max_frames_limit=400,
            codec_queue_delay_us=5000,
            codec_max_batch_size=8,
            max_in_flight=8,
            max_queued=8,
            first_chunk_frames=1,
            chunk_frames=16,
            request_deadline_s=DEADLINE_S,
            pipeline=request.param.split("-")[0],
            fused_workers="process" if request.param == "fused-worker" else "auto",
        ),
        str(work / "repo"),
    )
    started = []

    def start(ports):
        srv = Supervised(repo, work, ports)
        started.append(srv)
        srv.wait_ready()
        return srv

    try:
        srv = start_on_free_ports(start, 3)
        srv.pipeline = request.param
        yield srv
    finally:
        for srv in started:
            if srv.proc.poll() is None:
                srv.proc.send_signal(signal.SIGTERM)
                try:
                    srv.proc.wait(30)
                except subprocess.TimeoutExpired:
                    srv.proc.kill()


def _one(url, **kw):
    """(ok, message) of one request on its own stream."""
    try:
        with StreamingClient(url) as c:
            r = c.synthesize(timeout=60, **kw)
        return (r.audio.size > 0, "")
    except TtsError as e:
        return (False, str(e))


def test_open_loop_burst_no_stub_dies(server):
    before = server.stubs()
    rng = random.Random(3)
    futs = []
    with ThreadPoolExecutor(max_workers=48) as pool:
        t_end = time.time() + 30
        while time.time() < t_end:  # Poisson arrivals at 8 req/s of 40-frame clips: beyond 2 cores
            futs.append(pool.submit(_one, server.grpc_url, text=TEXT, max_frames=40, ignore_eos=True))
            time.sleep(rng.expovariate(8.0))
            if rng.random() < 0.1:  # and some clients that hang up mid-stream
                futs.append(pool.submit(_cancel_after_first_audio, server.grpc_url))
        results = [f.result(timeout=120) for f in futs]
    ok = sum(1 for good, _ in results if good)
    errors = [m for good, m in results if not good and m]
    assert ok >= 20, (ok, errors[:5])
    for m in errors:  # beyond capacity: refused with a code, never an unlabelled failure
        assert re.match(r"\[(UNAVAILABLE|CANCELLED)\]", m), m
    server.wait_gauges_zero()
    assert server.stubs() == before


def _cancel_after_first_audio(url):
    c = StreamingClient(url)
    try:
        c.send(build_inputs(text=TEXT, max_frames=300, ignore_eos=True))
        time.sleep(0.5)
    finally:
        c.close(cancel=True)
    return (False, "")


def test_stalled_talker_fails_the_request_at_its_deadline(server):
    """A talker stub stopped mid-stream (SIGSTOP): Triton still counts it as alive for the request
    inside it, which would wait for ever; the tts ends it at its deadline. (New requests to a
    stopped stub are refused by Triton itself as 'not healthy'.)"""
    talker = [server.engine_process()]
    out = []
    th = threading.Thread(target=lambda: out.append(_one(server.grpc_url, text=TEXT, max_frames=400, ignore_eos=True)))
    th.start()
    time.sleep(2)  # streaming
    os.kill(talker[0], signal.SIGSTOP)
    t = time.time()
    try:
        th.join(DEADLINE_S + 20)
        took = time.time() - t
    finally:
        os.kill(talker[0], signal.SIGCONT)
    ok, msg = out[0]
    assert not ok and msg.startswith("[UNAVAILABLE]") and "request_deadline_s" in msg, msg
    assert took < DEADLINE_S + 4, took
    server.wait_gauges_zero(60)
    assert _one(server.grpc_url, text=TEXT, max_frames=20) == (True, "")


def test_kill_talker_mid_stream_errors_quickly_then_serves_again(server):
    talker = [server.engine_process()]
    results, done = [], []

    def stream():
        t = time.time()
        results.append(_one(server.grpc_url, text=TEXT, max_frames=400, ignore_eos=True))
        done.append(time.time() - t)

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for th in threads:
        th.start()
    # all three streaming, the talker still generating: three 400-frame streams take about 3.5 s on
    # 2 CPU cores, and a talker killed after its last frame leaves streams that end well
    time.sleep(1)
    t_kill = time.time()
    os.kill(talker[0], signal.SIGKILL)
    for th in threads:
        th.join(30)
    waited = time.time() - t_kill
    assert len(results) == 3 and not any(ok for ok, _ in results), results
    assert waited < 8, (waited, results)  # errors within seconds, not never
    readies = sum(line.startswith("ready:") for line in server.lines)
    t = time.time()
    while sum(line.startswith("ready:") for line in server.lines) == readies:  # the restarted server
        assert server.proc.poll() is None and time.time() - t < 300, server.lines[-10:]
        time.sleep(0.5)
    assert any("died: restarting the server" in line for line in server.lines)
    assert server.ready()
    if server.pipeline == "split":
        assert any(i.startswith("talker") for i in server.stubs())
    else:  # the restarted tts started a new engine worker
        assert server.engine_process() != talker[0]
    assert _one(server.grpc_url, text=TEXT, max_frames=20) == (True, "")


def test_stop_after_cancels_is_quick_and_clean(server):
    for _ in range(3):
        _cancel_after_first_audio(server.grpc_url)
    time.sleep(1)
    size = os.path.getsize(server.log)
    t = time.time()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    took = time.time() - t
    with open(server.log, errors="replace") as f:
        f.seek(size)
        tail = f.read()
    assert took < 10, (took, tail[-2000:])
    assert "Segmentation fault" not in tail and "Fatal Python error" not in tail, tail[-3000:]
