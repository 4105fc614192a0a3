"""Write a random-weight Qwen3-TTS 12 Hz checkpoint in the official layout (``qwen3-tts-random-checkpoint``).

    qwen3-tts-random-checkpoint --preset tiny --out /tmp/tiny [--seed 0]
    qwen3-tts-random-checkpoint --preset 1.7b-base --out /data/q17b   # 3.9 GB + 682 MB
    qwen3-tts-random-checkpoint --list

The same preset and seed always give byte-identical files. Real sizes are streamed tensor by
tensor (bounded memory; see triton_qwen3_tts/tools/random_checkpoint.py for the value rules).
Needs torch and safetensors (``pip install 'triton-qwen3-tts[model]'``); ``--help`` does not.
``scripts/make_random_checkpoint.py`` runs the same.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from triton_qwen3_tts.model import presets


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _writer():
    try:
        from triton_qwen3_tts.tools import random_checkpoint
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("torch", "safetensors", "transformers"):
            raise
        raise SystemExit(
            f"error: writing a checkpoint needs {e.name}, part of the [model] extra: "
            "pip install 'triton-qwen3-tts[model]'"
        ) from None
    return random_checkpoint


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="qwen3-tts-random-checkpoint",
        description="Write a random-weight Qwen3-TTS 12 Hz checkpoint in the official layout "
        "(the audio it gives is noise: for tests and benchmarks without downloading weights).",
    )
    ap.add_argument(
        "--preset",
        choices=presets.PRESETS,
        metavar="|".join(presets.PRESETS),
        help="which model layout to write: " + ", ".join(presets.PRESETS),
    )
    ap.add_argument("--out", type=Path, help="output directory (created; must be empty)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--method",
        choices=("auto", "module", "fast"),
        default="auto",
        help="auto (default), module or fast: module init helpers for tiny presets, streamed per-tensor "
        "values for real sizes",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--list", action="store_true", help="list presets with tensor/parameter counts and sizes (nothing written)"
    )
    args = ap.parse_args(argv)

    if args.list:
        rc = _writer()
        print(
            f"{'preset':<18} {'type':<13} {'tensors':>7} {'params':>15} {'model':>9}  "
            f"{'st tensors':>10} {'st params':>13} {'st size':>9}"
        )
        for name in presets.PRESETS:
            s = rc.preset_summary(name)
            print(
                f"{name:<18} {s['tts_model_type']:<13} {s['model_tensors']:>7} "
                f"{s['model_params']:>15,} {_gb(s['model_bytes']):>9}  "
                f"{s['speech_tokenizer_tensors']:>10} {s['speech_tokenizer_params']:>13,} "
                f"{_gb(s['speech_tokenizer_bytes']):>9}"
            )
        return 0
    if args.preset is None or args.out is None:
        ap.error("--preset and --out are required (or use --list)")
    rc = _writer()
    t0 = time.perf_counter()
    out = rc.write_random_checkpoint(
        args.preset, args.out, args.seed, method=args.method, progress=not args.no_progress, overwrite=args.overwrite
    )
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {args.preset} (seed {args.seed}) to {out}: {_gb(size)} in {time.perf_counter() - t0:.1f} s")
    if args.preset.startswith("tiny"):
        print("note: random weights: the audio it gives is noise (cap requests with --max-frames)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
