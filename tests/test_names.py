"""No file of the repository names the package by its old name.

The package was renamed (import name ``triton_qwen3_tts``, distribution ``triton-qwen3-tts``); the
old distribution name belongs to an unrelated project on PyPI, so a leftover would point users at
someone else's package. Every file git tracks or would track (``git ls-files -co
--exclude-standard``), by path and by content, is checked, except ``docs/bench/``: the raw records
of past benchmark runs, verbatim outputs that name the paths of the day and are not edited. The
old names are built from pieces here, so that this file does not name them itself.
"""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD = ("qwen3_tts" + "_triton", "qwen3-tts" + "-triton")  # lower case, as the names were written
EXCLUDED = ("docs/bench/",)


def _files():
    r = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, timeout=60
    )
    if r.returncode != 0:
        pytest.skip(f"not a git checkout: {r.stderr.decode(errors='replace').strip()}")
    return [f for f in r.stdout.decode().split("\0") if f and not f.startswith(EXCLUDED)]


def test_no_file_names_the_old_package_name():
    found = []
    for rel in _files():
        path = ROOT / rel
        if any(old in rel for old in OLD):
            found.append(f"{rel}: the path")
        if not path.is_file():  # deleted in the work tree
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if any(old in line for old in OLD):
                found.append(f"{rel}:{n}: {line.strip()[:160]}")
    assert not found, "the old name is still used:\n" + "\n".join(found)
