"""The system tests' server start: a port lost to another process between free_ports and the
server's bind is retried on fresh ports."""

import socket
import urllib.request

import pytest
import system_support

from triton_qwen3_tts.tools import launcher


def test_a_port_in_use_is_retried_on_fresh_ports():
    tried = []

    def start(ports):
        tried.append(ports)
        if len(tried) < 3:
            raise launcher.LaunchError(
                f"failed to start GRPC service: Unavailable - Socket '{ports[0]}' already in use"
            )
        return ports

    assert system_support.start_on_free_ports(start, 2) == tried[-1]
    assert len(tried) == 3 and all(len(p) == 2 for p in tried)


def test_other_failures_are_not_retried():
    tried = []

    def start(ports):
        tried.append(ports)
        raise launcher.LaunchError("tritonserver exited with code 1 before it was ready; model load failed")

    with pytest.raises(launcher.LaunchError, match="model load failed"):
        system_support.start_on_free_ports(start, 3)
    assert len(tried) == 1


def test_the_last_attempts_error_is_raised():
    tried = []

    def start(ports):
        tried.append(ports)
        raise launcher.LaunchError(f"attempt {len(tried)}: already in use")

    with pytest.raises(launcher.LaunchError, match="attempt 3: already in use"):
        system_support.start_on_free_ports(start, 3, attempts=3)
    assert len(tried) == 3


@pytest.mark.system
@pytest.mark.parametrize("taken", [0, 1, 2], ids=["http", "grpc", "metrics"])
def test_the_real_server_starts_after_losing_a_port(tmp_path, monkeypatch, taken):
    """The first attempt's ``taken`` port is bound by another socket after the launcher checked it
    (the check is patched to pass, as it does in the race): tritonserver fails on it (for the
    metrics port only after it has answered ready) and the start succeeds on fresh ports."""
    (tmp_path / "repo").mkdir()  # no model: the server is ready within a second
    thief = socket.socket()  # bound, not listening: like an outgoing connection's ephemeral port
    thief.bind(("127.0.0.1", 0))
    first = system_support.free_ports(3)
    first[taken] = thief.getsockname()[1]
    offered = [first]
    fresh = system_support.free_ports
    monkeypatch.setattr(system_support, "free_ports", lambda n: offered.pop(0) if offered else fresh(n))
    monkeypatch.setattr(launcher, "_port_in_use", lambda port: False)
    try:
        server = system_support.start_triton(tmp_path / "repo", tmp_path / "server.log", ready_timeout=60)
    finally:
        thief.close()
    try:
        assert [server.http_port, server.grpc_port, server.metrics_port] != first
        assert server.proc.poll() is None and server.is_ready()
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).close()
        log = (tmp_path / "server.log").read_text()
        assert f"Socket '127.0.0.1:{first[taken]}' already in use" in log, log
    finally:
        server.stop()
