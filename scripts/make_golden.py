#!/usr/bin/env python
"""Regenerate the golden parity fixtures (tests/fixtures/golden.{npz,json}) from the official
qwen-tts 0.1.1 implementation. See docs/golden.md.

    python scripts/make_golden.py            # venv .venv-golden (made once), fixtures -> tests/fixtures

Steps:
1. make (or reuse) the golden venv: CPU torch==2.13.0 (the local wheel), qwen-tts==0.1.1
   --no-deps and its 12 Hz dependencies pinned (transformers 4.57.3, accelerate 1.12.0, ...);
   never torchaudio / sox / gradio (see scripts/golden_official.py for the import stubs);
2. write the tiny random checkpoints (presets tiny, tiny-base, tiny-voicedesign, --seed) with OUR
   scripts/make_random_checkpoint.py, run by the project venv, into a temp dir; record the
   sha256 of every checkpoint file so the test can tell when the checkpoints changed;
3. run scripts/golden_official.py inside the golden venv on those checkpoints.

Idempotent: the venv carries a stamp of its pins and is reused when it matches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("tiny", "tiny-base", "tiny-voicedesign")

TORCH = "torch==2.13.0"  # the local CPU wheel (pip config find-links); never a CUDA build
PINS = [
    "transformers==4.57.3",
    "accelerate==1.12.0",
    "librosa==0.11.0",
    "soundfile==0.14.0",
    "onnxruntime==1.32.0",
    "einops==0.8.2",
    "huggingface_hub==0.36.2",
    "safetensors==0.8.0",
    "numpy==1.26.4",
]
OFFICIAL = "qwen-tts==0.1.1"  # --no-deps: its torchaudio/sox/gradio requirements are not wanted


def _stamp() -> str:
    return hashlib.sha256(json.dumps([TORCH, PINS, OFFICIAL, sys.version_info[:2]]).encode()).hexdigest()[:16]


def _run(cmd, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def ensure_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    stamp_file = venv / ".stamp"
    if py.exists() and stamp_file.exists() and stamp_file.read_text().strip() == _stamp():
        print(f"golden venv {venv} is up to date")
        return py
    _run([sys.executable, "-m", "venv", venv])
    pip = [py, "-m", "pip", "install", "-q"]
    _run(pip + [TORCH])
    _run(pip + PINS + [TORCH])  # torch repeated so the resolver can never swap it
    _run(pip + ["--no-deps", OFFICIAL])
    _run(
        [
            py,
            "-c",
            "import torch, transformers, numpy; assert torch.__version__.startswith('2.13.0'), "
            "torch.__version__; assert not torch.version.cuda; print('golden venv ok', "
            "torch.__version__, transformers.__version__, numpy.__version__)",
        ]
    )
    stamp_file.write_text(_stamp() + "\n")
    return py


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_hashes(d: Path) -> dict:
    return {
        str(p.relative_to(d)): _sha256(p) for p in sorted(d.rglob("*")) if p.is_file() and not p.name.startswith(".")
    }


def write_checkpoints(project_py: Path, out: Path, seed: int) -> dict:
    hashes = {}
    for preset in PRESETS:
        d = out / preset
        for attempt in range(3):  # a transient crash (a bus error once) must not kill the run
            try:
                _run(
                    [
                        project_py,
                        ROOT / "scripts" / "make_random_checkpoint.py",
                        "--preset",
                        preset,
                        "--seed",
                        seed,
                        "--out",
                        d,
                        "--no-progress",
                        "--overwrite",
                    ],
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
                break
            except subprocess.CalledProcessError:
                if attempt == 2:
                    raise
                shutil.rmtree(d, ignore_errors=True)
                time.sleep(2)
        hashes[preset] = checkpoint_hashes(d)
    return hashes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-golden")
    ap.add_argument(
        "--project-python",
        type=Path,
        default=None,
        help="python of the project venv (default: .venv/bin/python, else this python)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    ap.add_argument("--seed", type=int, default=0, help="random checkpoint seed (conftest TINY_SEED)")
    ap.add_argument(
        "--keep-checkpoints",
        type=Path,
        default=None,
        help="write the checkpoints here and keep them (default: a temp dir, removed)",
    )
    args = ap.parse_args(argv)

    project_py = args.project_python or (ROOT / ".venv" / "bin" / "python")
    if not Path(project_py).exists():
        project_py = Path(sys.executable)
    golden_py = ensure_venv(args.venv)

    tmp = Path(tempfile.mkdtemp(prefix="golden-ckpt-")) if args.keep_checkpoints is None else args.keep_checkpoints
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        hashes = write_checkpoints(Path(project_py), tmp, args.seed)
        commit = (
            subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
            or None
        )
        extra = {
            "script": "scripts/make_golden.py",
            "repo_commit": commit,
            "checkpoint_seed": args.seed,
            "checkpoint_sha256": hashes,
            "command": "python scripts/make_golden.py",
        }
        extra_file = tmp / "extra_manifest.json"
        extra_file.write_text(json.dumps(extra))
        _run(
            [
                golden_py,
                ROOT / "scripts" / "golden_official.py",
                "--checkpoints",
                tmp,
                "--checkpoint-seed",
                args.seed,
                "--out",
                args.out,
                "--extra-manifest",
                extra_file,
            ],
            env={
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "TRANSFORMERS_VERBOSITY": "error",
                "HF_HUB_OFFLINE": "1",
                "PYTHONPATH": "",
            },
        )
    finally:
        if args.keep_checkpoints is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
