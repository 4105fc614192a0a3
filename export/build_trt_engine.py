#!/usr/bin/env python
"""Build the codec decoder's TensorRT engine (model.plan) from the ONNX export.

    python export/build_trt_engine.py [--onnx build/codec_decoder.onnx] \\
        [--out model_repository/codec_decoder/1/model.plan] \\
        [--batch-profile 1 8 64] [--frames-profile 1 97 97] [--fp32] \\
        [--timing-cache build/trt_timing.cache] [--workspace-mib N] [--opt-level 0..5]

One optimization profile over input ``audio_codes`` [batch, frames, 16]: batch MIN..OPT..MAX
(MAX <= 256) and frames MIN..OPT..MAX (MAX <= 8192). Frames must cover every window the tts model
sends: it pads windows to its frame buckets, the largest being left context + chunk (72 + 25 =
97 by default). Precision: fp16 by default (I/O stays int64 in / fp32 out), ``--fp32`` for full
precision. TF32 stays off. The timing cache is read if present and written back, so rebuilds
are fast. Built with polygraphy's TensorRT loaders (the TensorRT Python API underneath).

Arguments are validated before TensorRT is looked for. Exit codes: 0 built; 1 build failed;
2 bad arguments; 3 TensorRT (python package ``tensorrt``) is not installed.
The engine is specific to the GPU model and TensorRT version: build it where it is served, and
never commit it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen3_tts_triton.onnx_export import (  # noqa: E402
    DEFAULT_ONNX_PATH,
    DEFAULT_PLAN_PATH,
    DEFAULT_TIMING_CACHE,
    EXIT_FAILED,
    EXIT_NO_TENSORRT,
    EXIT_OK,
    INPUT_NAME,
    TENSORRT_MISSING,
    ShapeProfile,
    have_tensorrt,
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--onnx", default=DEFAULT_ONNX_PATH, help=f"input ONNX (default {DEFAULT_ONNX_PATH})")
    ap.add_argument("--out", default=DEFAULT_PLAN_PATH, help=f"engine path (default {DEFAULT_PLAN_PATH})")
    ap.add_argument("--batch-profile", type=int, nargs=3, metavar=("MIN", "OPT", "MAX"), default=[1, 8, 64],
                    help="batch sizes of the profile (default 1 8 64; MAX should be the model's max_batch_size)")
    ap.add_argument("--frames-profile", type=int, nargs=3, metavar=("MIN", "OPT", "MAX"), default=[1, 97, 97],
                    help="frames per window, context included (default 1 97 97)")
    ap.add_argument("--fp32", action="store_true", help="build in fp32 (default: fp16 enabled)")
    ap.add_argument("--timing-cache", default=DEFAULT_TIMING_CACHE,
                    help=f"timing cache file, read if present and updated (default {DEFAULT_TIMING_CACHE}); "
                         "'' disables it")
    ap.add_argument("--workspace-mib", type=int, default=None, help="builder workspace limit in MiB (default: TensorRT's)")
    ap.add_argument("--opt-level", type=int, default=None, choices=range(0, 6), metavar="0..5",
                    help="builder optimization level (default: TensorRT's, 3)")
    return ap


def parse_args(argv=None):
    """Parse and validate; argparse exits with code 2 and a message on any bad value."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.profile = ShapeProfile(tuple(args.batch_profile), tuple(args.frames_profile))
    except ValueError as e:
        ap.error(str(e))
    if args.workspace_mib is not None and args.workspace_mib < 1:
        ap.error(f"--workspace-mib must be >= 1, got {args.workspace_mib}")
    if not os.path.isfile(args.onnx):
        ap.error(f"--onnx: file not found: {args.onnx} (run export/export_codec_onnx.py first)")
    if os.path.isdir(args.out):
        ap.error(f"--out is a directory: {args.out}")
    return args


def build_engine(args) -> bytes:
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    mn, opt, mx = args.profile.shapes()
    profile = Profile().add(INPUT_NAME, min=mn, opt=opt, max=mx)
    cache = args.timing_cache or None
    if cache:
        os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
    pools = None
    if args.workspace_mib:
        pools = {trt.MemoryPoolType.WORKSPACE: args.workspace_mib << 20}
    config = CreateConfig(
        fp16=not args.fp32,
        tf32=False,
        profiles=[profile],
        load_timing_cache=cache if cache and os.path.exists(cache) else None,
        memory_pool_limits=pools,
        builder_optimization_level=args.opt_level,
    )
    build = EngineBytesFromNetwork(NetworkFromOnnxPath(args.onnx), config=config, save_timing_cache=cache)
    return bytes(build())


def main(argv=None) -> int:
    args = parse_args(argv)
    if not have_tensorrt():
        print(f"error: {TENSORRT_MISSING}", file=sys.stderr)
        return EXIT_NO_TENSORRT
    import tensorrt as trt

    p = args.profile
    print(f"TensorRT {trt.__version__}: building {args.onnx} -> {args.out}")
    print(f"profile {INPUT_NAME}: batch {p.batch}, frames {p.frames}; precision {'fp32' if args.fp32 else 'fp16'}")
    t0 = time.time()
    try:
        data = build_engine(args)
    except Exception as e:  # the builder reports through exceptions and its logger
        print(f"error: TensorRT build failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, args.out)  # a half-written plan is never left under the served name
    print(f"wrote {args.out} ({len(data) / 1e6:.1f} MB) in {time.time() - t0:.1f}s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
