"""The linters configured in pyproject.toml find nothing: ruff (pyflakes and syntax errors), ruff's
formatter and codespell. Both come with the test environment (requirements/cpu-3-serving.txt)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    r = _run("ruff", "check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_changes_nothing():
    r = _run("ruff", "format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr + "\n(run: ruff format .)"


def test_codespell_finds_nothing():
    r = _run("codespell_lib", ".")
    assert r.returncode == 0, r.stdout + r.stderr
