#!/usr/bin/env python
"""Export the Qwen3-TTS 12 Hz codec decoder of a checkpoint to ONNX and check parity with PyTorch.

    python export/export_codec_onnx.py --checkpoint /models/Qwen3-TTS-12Hz-1.7B-CustomVoice \\
        [--out build/codec_decoder.onnx] [--opset 18] [--no-trt-fusion-barrier] \\
        [--parity-shapes 1x1,1x2,2x13,3x37,2x97] [--atol 1e-4] [--skip-parity]

I/O: ``audio_codes`` INT64 [batch, frames, 16] -> ``audio_values`` FP32 [batch, frames*1920];
dynamic batch and frames; fp32. By default a TensorRT fusion barrier (Add(x, Sub(c, c)) before
and after the Transpose after the pre-transformer) is inserted, and it is checked that the
barrier leaves onnxruntime's output unchanged. Parity: onnxruntime CPU vs PyTorch for every
shape, plus per-row independence for batch > 1; max |diff| must be <= --atol.

Exit codes: 0 ok; 1 parity (or barrier check) failed; 2 bad arguments or missing checkpoint.
The ONNX file is a build artefact (under build/, git-ignored): never commit it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXIT_OK, EXIT_PARITY, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    from triton_qwen3_tts.export.codec_onnx import DEFAULT_ONNX_PATH, DEFAULT_OPSET

    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--checkpoint", required=True, help="Qwen3-TTS checkpoint directory (official layout)")
    ap.add_argument("--out", default=DEFAULT_ONNX_PATH, help=f"output ONNX path (default: {DEFAULT_ONNX_PATH})")
    ap.add_argument("--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset, >= 18 (default {DEFAULT_OPSET})")
    ap.add_argument(
        "--no-trt-fusion-barrier",
        dest="trt_fusion_barrier",
        action="store_false",
        help="do not insert the TensorRT 10.x fusion barrier around the post-transformer Transpose",
    )
    ap.add_argument(
        "--parity-shapes",
        default="1x1,1x2,2x13,3x37,2x97",
        help="comma list of BATCHxFRAMES for the parity check (default: %(default)s)",
    )
    ap.add_argument("--atol", type=float, default=1e-4, help="max |onnx - torch| allowed (default 1e-4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random test codes")
    ap.add_argument("--skip-parity", action="store_true", help="export only (not recommended)")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from triton_qwen3_tts.export.codec_onnx import (
        MIN_OPSET,
        apply_trt_fusion_barrier_file,
        check_parity,
        compare_onnx_models,
        export_codec_onnx,
        load_decoder_from_checkpoint,
        parse_shapes,
    )

    try:
        shapes = parse_shapes(args.parity_shapes)
    except ValueError as e:
        ap.error(f"--parity-shapes: {e}")
    if args.opset < MIN_OPSET:
        ap.error(f"--opset must be >= {MIN_OPSET}, got {args.opset}")
    if not args.atol > 0:
        ap.error(f"--atol must be > 0, got {args.atol}")
    if not os.path.isdir(args.checkpoint):
        print(f"error: checkpoint directory not found: {args.checkpoint}", file=sys.stderr)
        return EXIT_USAGE

    import torch

    torch.set_num_threads(min(torch.get_num_threads(), int(os.environ.get("QWEN3_TTS_TORCH_THREADS", "2"))))
    t0 = time.time()
    decoder, st_cfg = load_decoder_from_checkpoint(args.checkpoint)
    n_params = sum(p.numel() for p in decoder.parameters())
    cb = st_cfg.decoder.codebook_size
    spf = st_cfg.samples_per_frame
    print(f"loaded decoder: {n_params / 1e6:.1f}M params, {spf} samples/frame ({time.time() - t0:.1f}s)")

    t0 = time.time()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        # Export without the barrier, then add it to a copy: the plain export is the reference
        # for checking that the barrier is a numerical no-op (one export, not two).
        plain = os.path.join(tmp, "plain.onnx") if args.trt_fusion_barrier else args.out
        res = export_codec_onnx(decoder, plain, opset=args.opset, trt_fusion_barrier=False, codebook_size=cb)
        barrier_at = None
        if args.trt_fusion_barrier:
            barrier_at = apply_trt_fusion_barrier_file(plain, args.out)
        size_mb = os.path.getsize(args.out) / 1e6
        print(f"exported {args.out}: opset {res.opset}, {size_mb:.1f} MB ({time.time() - t0:.1f}s)")
        print(f"trt fusion barrier: {'around ' + repr(barrier_at) if barrier_at else 'off'}")
        if args.skip_parity:
            print("parity: skipped (--skip-parity)")
            return EXIT_OK
        if args.trt_fusion_barrier:
            d = compare_onnx_models(args.out, plain, shapes, codebook_size=cb)
            print(f"barrier check: max |with - without| = {d:.3e}")
            if d > 1e-6:
                print("error: the TRT fusion barrier changed onnxruntime's output", file=sys.stderr)
                ok = False

    t0 = time.time()
    rep = check_parity(
        decoder, args.out, shapes, atol=args.atol, codebook_size=cb, seed=args.seed, samples_per_frame=spf
    )
    print(rep.summary())
    print(f"parity time {time.time() - t0:.1f}s")
    ok = ok and rep.ok
    return EXIT_OK if ok else EXIT_PARITY


if __name__ == "__main__":
    sys.exit(main())
