"""The README's first command on the CPU machine: ``scripts/quickstart.sh --cpu``.

It must end with a valid 24 kHz mono ``hello.wav`` and a stopped server. The test runs the real
script end to end (environment check, checkpoint, repository, tritonserver, gRPC client, stop)
with the venv the tests run in and ``HF_HUB_OFFLINE=1``, so the tiny random checkpoint is used
and nothing is downloaded. About 1-2 minutes on 2 cores (mostly the server start).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[1]


def _processes_mentioning(needle: str):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            found.append((int(pid), cmd))
    return found


def test_quickstart_cpu_writes_hello_wav_and_stops_the_server(tmp_path):
    import soundfile as sf

    work = tmp_path / "work"
    out = tmp_path / "hello.wav"
    env = dict(os.environ, QUICKSTART_DIR=str(work), QWEN3_TTS_VENV=sys.prefix, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "quickstart.sh"), "--cpu", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "RANDOM checkpoint" in r.stderr  # said loudly
    info = sf.info(str(out))
    assert info.format == "WAV" and info.samplerate == 24000 and info.channels == 1, info
    wav, _ = sf.read(str(out), dtype="float32")
    assert info.frames == 40 * 1920 or (0 < info.frames < 40 * 1920 and info.frames % 1920 == 0), info.frames
    assert (wav != 0).any()
    # the server is stopped: no process still serves the quick start's repository
    assert _processes_mentioning(str(work / "repo")) == []
