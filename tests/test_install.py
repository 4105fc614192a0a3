"""``pip install`` of the package into a fresh virtual environment gives working commands.

A new venv (no system site-packages) gets ``pip install <copy of the package sources>`` against
PyPI alone (the machine's pip configuration, with its local wheel folders and torch cap, is left
out as in tests/test_docker_requirements.py). Then: no torch was installed (it is the ``model``
extra, pyproject.toml says why), every console command's ``--help`` exits 0, the installed
``qwen3-tts-build-repository`` builds a CPU repository for the tiny random checkpoint from the
templates shipped in the wheel (not from this checkout), the installed client reaches the network
(and says that nothing listens), and a command that needs the extra says how to get it.

Measured on the 2-core development machine: 23 s run alone (the fresh venv and ``pip install``
12 s, the tiny checkpoint 5 s, which the full suite shares with other tests: 13 s there). Skips
when PyPI is unreachable.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _reachable(host: str, timeout: float = 5.0) -> bool:
    try:
        urllib.request.urlopen(f"https://{host}/", timeout=timeout)
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except Exception:
        return False


def _pip_env():
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PIP_FIND_LINKS",
            "PIP_CONSTRAINT",
            "PIP_EXTRA_INDEX_URL",
            "PIP_INDEX_URL",
            "PIP_NO_INDEX",
            "PYTHONPATH",
        )
    }
    env["PIP_CONFIG_FILE"] = os.devnull  # ignore the machine's pip.conf (local indexes, torch cap)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not _reachable("pypi.org"):
        pytest.skip("PyPI is unreachable: cannot install the package into a fresh venv")
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # what a clone holds of the package, without build outputs of this checkout
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.plan", "*.onnx")
    for d in ("triton_qwen3_tts", "model_repository"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    v = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(v)], check=True, timeout=120)
    r = subprocess.run(
        [str(v / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
        capture_output=True,
        text=True,
        env=_pip_env(),
        cwd=tmp,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return v


def _run(venv, *args, cwd, env=None, timeout=120):
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**_pip_env(), **(env or {})},
        timeout=timeout,
    )


def test_the_install_is_light_and_its_own(venv, tmp_path):
    code = (
        "import importlib.util, json, triton_qwen3_tts, triton_qwen3_tts.serving.repository as r; "
        "print(json.dumps([triton_qwen3_tts.__file__, r.TEMPLATES, "
        "[m for m in ('torch', 'transformers', 'safetensors', 'vllm') if importlib.util.find_spec(m)]]))"
    )
    r = _run(venv, "python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    package, templates, heavy = json.loads(r.stdout)
    assert package.startswith(str(venv)) and templates.startswith(str(venv)), (package, templates)
    assert heavy == []  # torch & co. are the model extra


def test_every_command_answers_help(venv, tmp_path):
    for name in SCRIPTS:
        r = _run(venv, name, "--help", cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith(f"usage: {name} "), (name, r.stdout[-500:], r.stderr[-2000:])


def test_installed_builder_writes_a_cpu_repository(venv, tmp_path, tiny_checkpoint):
    out = tmp_path / "repo"
    r = _run(
        venv,
        "qwen3-tts-build-repository",
        "--checkpoint",
        str(tiny_checkpoint),
        "--out",
        str(out),
        "--max-frames-limit",
        "1024",
        "--default-max-frames",
        "1024",
        "--max-text-chars",
        "500",
        "--max-instruct-chars",
        "200",
        cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": "", "QWEN3_TTS_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "device: cpu" in r.stdout and "codec backend: python" in r.stdout
    for model in ("talker", "tts", "codec_decoder"):
        assert "${" not in (out / model / "config.pbtxt").read_text()
    src = {"talker": "talker", "tts": "tts", "codec_decoder": "codec_decoder_python"}
    for model, template in src.items():
        shipped = (out / model / "1" / "model.py").read_bytes()
        assert shipped == (ROOT / "model_repository" / template / "1" / "model.py").read_bytes(), model
    assert 'string_value: "cpu"' in (out / "talker" / "config.pbtxt").read_text()


def test_installed_client_and_model_extra_messages(venv, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _run(venv, "qwen3-tts-client", "--text", "hi", "--url", f"127.0.0.1:{port}", "--timeout", "10", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith(f"error: cannot connect to 127.0.0.1:{port}"), r.stderr
    assert "qwen3-tts-serve" in r.stderr
    r = _run(venv, "qwen3-tts-random-checkpoint", "--preset", "tiny", "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert r.returncode != 0 and "pip install 'triton-qwen3-tts[model]'" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
