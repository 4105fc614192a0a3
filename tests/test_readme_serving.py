"""README's *Serving* commands for a machine without GPU, run exactly as written.

The first two ``bash`` blocks of the section are taken from README.md as they are: the first
(environment, random checkpoint, repository, ``qwen3-tts-serve`` in the foreground) runs in the
background like a first terminal, the second (``qwen3-tts-client``) runs once the server printed
``ready``, like a second terminal; then Ctrl-C (SIGINT) stops the server. They run in the
checkout's root (``build/`` is git-ignored; ``hello.wav`` is removed afterwards), on the default
ports 8000-8002, with the ``.venv`` that ``scripts/test.sh`` builds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[1]


def serving_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Serving\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_the_blocks_are_the_cpu_ones():
    first, second = serving_blocks()[:2]
    assert "qwen3-tts-serve" in first and "--codec-backend tensorrt" not in first
    assert "qwen3-tts-client" in second and "hello.wav" in second


def test_readme_cpu_serving_commands_serve_a_request(tmp_path):
    import soundfile as sf

    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("README's commands use the checkout's .venv (scripts/setup_env.sh builds it)")
    first, second = serving_blocks()[:2]
    wav = ROOT / "hello.wav"
    wav.unlink(missing_ok=True)
    log = tmp_path / "terminal1.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    with open(log, "w") as out:
        server = subprocess.Popen(
            ["bash", "-c", first], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 600
        while not re.search(r"^ready: ", log.read_text(), re.M):
            assert server.poll() is None, f"the first block ended ({server.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no 'ready' after 600 s:\n{log.read_text()[-3000:]}"
            time.sleep(2)
        client = subprocess.run(["bash", "-c", second], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert client.returncode == 0, client.stdout + client.stderr
        audio, rate = sf.read(wav)
        assert rate == 24000 and audio.ndim == 1 and len(audio) > 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)  # Ctrl-C in the first terminal
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        wav.unlink(missing_ok=True)
    assert server.returncode is not None
