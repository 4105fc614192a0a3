"""Shared pytest setup: thread cap, slow-test gating, and the tiny random checkpoints.

Fixtures ``tiny_checkpoint`` (CustomVoice), ``tiny_base_checkpoint`` and
``tiny_voicedesign_checkpoint`` write a random checkpoint of the matching ``presets`` entry once
per session (a few MB) and return its directory as a ``pathlib.Path``. Treat it as read-only:
it is shared by every test. With ``QWEN3_TTS_TEST_CACHE=/some/dir`` the checkpoints are kept
there across sessions, keyed by a fingerprint of the presets and of the source of the modules
that define the layout, so a change to any of them writes a fresh one.

Slow tests (``@pytest.mark.slow``) are skipped unless ``-m slow`` (any -m expression naming
"slow"), ``--run-slow`` or ``QWEN3_TTS_SLOW=1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Two CPU cores are shared by everyone: cap intra-op threads before torch is first imported.
MAX_THREADS = 1
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(MAX_THREADS))

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "triton_qwen3_tts"
# Source files whose content defines the bytes of a random checkpoint.
# The sources a random checkpoint's bytes depend on: a change to one of them rewrites the cached copy.
_LAYOUT_SOURCES = (
    "model/presets.py",
    "model/config.py",
    "model/tensor_specs.py",
    "tools/random_checkpoint.py",
    "model/talker.py",
    "model/speaker_encoder.py",
    "model/codec.py",
    "model/codec_encoder.py",
    "model/text.py",
)
TINY_SEED = 0


def _cap_torch_threads() -> None:
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.get_num_threads() > MAX_THREADS:
            torch.set_num_threads(MAX_THREADS)


def pytest_addoption(parser):
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="run tests marked slow (real sizes, long runs)"
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: real-size or long-running tests (run with -m slow)")
    _cap_torch_threads()


def _slow_enabled(config) -> bool:
    return (
        config.getoption("--run-slow")
        or os.environ.get("QWEN3_TTS_SLOW") == "1"
        or "slow" in (config.getoption("markexpr") or "")
    )


def pytest_collection_modifyitems(config, items):
    _cap_torch_threads()
    if _slow_enabled(config):
        return
    skip = pytest.mark.skip(reason="slow test: run with -m slow, --run-slow or QWEN3_TTS_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


_RESOLVE_TESTS = {"test_cu13_resolves": "cu13", "test_stub_step_resolves": "stub", "test_cu12_resolves": "cu12"}


def pytest_collection_finish(session):
    """Start the selected requirement resolutions of tests/test_docker_requirements.py in the
    background now: they wait on PyPI for minutes, and the rest of the suite runs meanwhile."""
    if session.config.option.collectonly:
        return
    picked = [
        item
        for item in session.items
        if item.name in _RESOLVE_TESTS and item.module.__name__.endswith("test_docker_requirements")
    ]
    if picked:
        picked[0].module.start_resolutions(tuple(_RESOLVE_TESTS[item.name] for item in picked))


def _fingerprint(preset: str, seed: int) -> str:
    from triton_qwen3_tts.model import presets

    h = hashlib.sha256()
    h.update(
        json.dumps(
            [preset, seed, presets.main_config(preset), presets.speech_tokenizer_config(preset)], sort_keys=True
        ).encode()
    )
    for name in _LAYOUT_SOURCES:
        p = PACKAGE / name
        h.update(name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def make_tiny_checkpoint(preset: str, base_dir: Path, seed: int = TINY_SEED) -> Path:
    """Write (or reuse) the random checkpoint of ``preset`` under ``base_dir``; return its path."""
    from triton_qwen3_tts.tools.random_checkpoint import write_random_checkpoint

    _cap_torch_threads()

    out = base_dir / f"{preset}-seed{seed}-{_fingerprint(preset, seed)}"
    done = out / ".complete"
    if done.exists():
        return out
    base_dir.mkdir(parents=True, exist_ok=True)
    if out.exists():  # an interrupted earlier write
        shutil.rmtree(out, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{preset}-", dir=base_dir))
    try:
        write_random_checkpoint(preset, tmp / "ckpt", seed, progress=False)
        (tmp / "ckpt" / ".complete").write_text("ok\n")
        try:
            os.replace(tmp / "ckpt", out)  # atomic; loses a race to a concurrent session only
        except OSError:
            if not done.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def tiny_checkpoint_dir(tmp_path_factory) -> Path:
    """Where the session's tiny checkpoints live ($QWEN3_TTS_TEST_CACHE or a session tmp dir)."""
    cache = os.environ.get("QWEN3_TTS_TEST_CACHE")
    return Path(cache) if cache else tmp_path_factory.mktemp("tiny_checkpoints")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoint_dir) -> Path:
    """Random checkpoint of preset "tiny" (CustomVoice, 9 speakers, 12 languages)."""
    return make_tiny_checkpoint("tiny", tiny_checkpoint_dir)


@pytest.fixture(scope="session")
def tiny_base_checkpoint(tiny_checkpoint_dir) -> Path:
    """Random checkpoint of preset "tiny-base" (Base: speaker encoder, ICL)."""
    return make_tiny_checkpoint("tiny-base", tiny_checkpoint_dir)


@pytest.fixture(scope="session")
def tiny_voicedesign_checkpoint(tiny_checkpoint_dir) -> Path:
    """Random checkpoint of preset "tiny-voicedesign"."""
    return make_tiny_checkpoint("tiny-voicedesign", tiny_checkpoint_dir)
