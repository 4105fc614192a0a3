"""The launcher starts the real tritonserver (nvidia-pytriton wheel) and stops it cleanly."""

import os
import textwrap

import pytest
from system_support import start_on_free_ports, start_triton

from triton_qwen3_tts.tools import launcher

pytestmark = pytest.mark.system


ECHO = textwrap.dedent("""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 2).astype(np.float32))]))
            return out
""")
CONFIG = textwrap.dedent("""
    name: "echo"
    backend: "python"
    max_batch_size: 0
    input [{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }]
    output [{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }]
    instance_group [{ kind: KIND_CPU count: 1 }]
""")


def test_server_starts_serves_and_stops(tmp_path):
    import numpy as np
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo" / "echo"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text(CONFIG)
    (repo / "1" / "model.py").write_text(ECHO)
    server = start_triton(tmp_path / "repo", tmp_path / "server.log", ready_timeout=120)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.arange(5, dtype=np.float32)
        inp = grpcclient.InferInput("X", [5], "FP32")
        inp.set_data_from_numpy(x)
        y = client.infer("echo", [inp]).as_numpy("Y")
        np.testing.assert_array_equal(y, x * 2)
    finally:
        server.stop()
    assert server.proc.poll() is not None
    # the whole process group is gone (no orphaned stubs)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)


def test_missing_repository_is_a_clear_error(tmp_path):
    with pytest.raises(launcher.LaunchError, match="does not exist"):
        launcher.server_command(str(tmp_path / "nope"))


def _launch_with_gateway(tmp_path):
    """The launcher CLI with its gateway on an echo repository, ready, on free ports
    (start_on_free_ports: a start that lost a port to another process before its bind is retried
    on fresh ones). Returns (launcher process, gateway port)."""
    import subprocess
    import sys
    import time
    import urllib.request

    repo = tmp_path / "repo" / "echo"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text(CONFIG)
    (repo / "1" / "model.py").write_text(ECHO)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    text = tmp_path / "launcher.txt"

    def start(ports):
        http, grpc, metrics, gw = ports
        out = open(text, "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "triton_qwen3_tts.tools.launcher", "--model-repository", str(tmp_path / "repo")]
            + ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
            + ["--gateway-port", str(gw), "--log", str(tmp_path / "server.log")]
            + ["--gateway-log", str(tmp_path / "gateway.log"), "--voices-dir", str(tmp_path / "voices")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + 120
        while proc.poll() is None:
            assert time.time() < deadline, text.read_text()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{gw}/health", timeout=2)
                if "ready:" in text.read_text():
                    return proc, gw
            except OSError:
                pass
            time.sleep(0.3)
        raise launcher.LaunchError(text.read_text())

    return start_on_free_ports(start, 4)


def test_the_launcher_starts_and_stops_the_gateway(tmp_path):
    import json
    import signal
    import urllib.error
    import urllib.request

    proc, gw = _launch_with_gateway(tmp_path)
    try:
        # /ready mirrors the server: ready, but it serves no tts model
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{gw}/ready", timeout=5)
        assert e.value.code == 503 and json.load(e.value)["error"]["code"] == "UNAVAILABLE"
        assert f"gateway http://127.0.0.1:{gw}/v1" in (tmp_path / "launcher.txt").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(60) == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{gw}/health", timeout=2)


def test_a_dead_gateway_stops_the_launcher(tmp_path):
    import signal
    import subprocess

    proc, gw = _launch_with_gateway(tmp_path)
    try:
        pids = subprocess.run(["pgrep", "-f", f"gateway.main.*--port {gw}"], capture_output=True, text=True).stdout
        assert pids.split(), "no gateway process"
        for pid in pids.split():
            os.kill(int(pid), signal.SIGKILL)
        assert proc.wait(60) == launcher.EXIT_GATEWAY_DIED
        assert "the gateway exited" in (tmp_path / "launcher.txt").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_readiness_waits_for_the_metrics_service_unless_it_is_off():
    """``wait_ready`` also waits for the metrics port (tritonserver answers ready before it starts
    that service and exits when its port is taken), except where the command turns metrics off."""
    from triton_qwen3_tts.tools.launcher import ServerCommand, TritonServer

    def server(*extra):
        return TritonServer(ServerCommand(["tritonserver", "--metrics-port=1", *extra], {}, "wheel"), 1, 2, 3, "log")

    assert server()._metrics_on()
    assert not server("--allow-metrics=false")._metrics_on()
    assert not server("--allow-metrics", "off")._metrics_on()
    assert server("--allow-metrics=false", "--allow-metrics=true")._metrics_on()  # the last one counts
    assert server("--metrics-port", "7")._flag("metrics-port") == "7"
    assert server()._flag("metrics-port") == "1"
