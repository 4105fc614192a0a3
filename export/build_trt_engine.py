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

Stateful codec (docs/design/stateful-codec.md): ``--stateful`` builds the ONNX of export/export_codec_stateful_onnx.py
(default ``--onnx build/codec_decoder_stateful.onnx --out build/codec_decoder_stateful.plan``,
``--frames-profile 1 25 25``: NEW frames per call). ``--checkpoint DIR`` or ``--preset NAME`` gives the
state layout (the same code the export uses; only config.json is read): every ``state_in_*`` input
gets the batch range of ``--batch-profile`` and its fixed per-row dims. The parsed network's inputs
are checked against that layout before building.

    python export/build_trt_engine.py --stateful --checkpoint CKPT [--batch-profile 1 8 64] \
        [--frames-profile 1 25 25] [--fp32]

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

from triton_qwen3_tts.export.stateful_trt import (  # noqa: E402
    DEFAULT_STATEFUL_ONNX_PATH,
    DEFAULT_STATEFUL_PLAN_PATH,
    apply_mode_defaults,
    check_io,
    expected_io,
    state_io_from_args,
    stateful_profile,
)
from triton_qwen3_tts.export.codec_onnx import (  # noqa: E402
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
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument(
        "--stateful",
        action="store_true",
        help="build the stateful codec's ONNX (state I/O; needs --checkpoint or --preset)",
    )
    ap.add_argument("--checkpoint", default=None, help="--stateful: checkpoint directory giving the state layout")
    ap.add_argument("--preset", default=None, help="--stateful: presets.py name giving the state layout (e.g. tiny)")
    ap.add_argument(
        "--onnx",
        default=None,
        help=f"input ONNX (default {DEFAULT_ONNX_PATH}; --stateful: {DEFAULT_STATEFUL_ONNX_PATH})",
    )
    ap.add_argument(
        "--out",
        default=None,
        help=f"engine path (default {DEFAULT_PLAN_PATH}; --stateful: {DEFAULT_STATEFUL_PLAN_PATH})",
    )
    ap.add_argument(
        "--batch-profile",
        type=int,
        nargs=3,
        metavar=("MIN", "OPT", "MAX"),
        default=None,
        help="batch sizes of the profile (default 1 8 64; MAX should be the model's max_batch_size)",
    )
    ap.add_argument(
        "--frames-profile",
        type=int,
        nargs=3,
        metavar=("MIN", "OPT", "MAX"),
        default=None,
        help="frames per window, context included (default 1 97 97); --stateful: new frames per call (default 1 25 25)",
    )
    ap.add_argument("--fp32", action="store_true", help="build in fp32 (default: fp16 enabled)")
    ap.add_argument(
        "--timing-cache",
        default=DEFAULT_TIMING_CACHE,
        help=f"timing cache file, read if present and updated (default {DEFAULT_TIMING_CACHE}); '' disables it",
    )
    ap.add_argument(
        "--workspace-mib", type=int, default=None, help="builder workspace limit in MiB (default: TensorRT's)"
    )
    ap.add_argument(
        "--opt-level",
        type=int,
        default=None,
        choices=range(0, 6),
        metavar="0..5",
        help="builder optimization level (default: TensorRT's, 3)",
    )
    return ap


def parse_args(argv=None):
    """Parse and validate; argparse exits with code 2 and a message on any bad value."""
    ap = build_parser()
    args = ap.parse_args(argv)
    apply_mode_defaults(args, "out")
    try:
        args.profile = ShapeProfile(tuple(args.batch_profile), tuple(args.frames_profile))
    except ValueError as e:
        ap.error(str(e))
    try:
        args.state_io = state_io_from_args(args)
    except ValueError as e:
        ap.error(str(e))
    if args.workspace_mib is not None and args.workspace_mib < 1:
        ap.error(f"--workspace-mib must be >= 1, got {args.workspace_mib}")
    if not os.path.isfile(args.onnx):
        exporter = "export_codec_stateful_onnx.py" if args.stateful else "export_codec_onnx.py"
        ap.error(f"--onnx: file not found: {args.onnx} (run export/{exporter} first)")
    if os.path.isdir(args.out):
        ap.error(f"--out is a directory: {args.out}")
    return args


def profile_shapes(args):
    """``input name -> (min, opt, max)`` of the one optimization profile."""
    if args.stateful:
        return stateful_profile(args.state_io, args.profile)
    return {INPUT_NAME: args.profile.shapes()}


def _network_io(network):
    ins = {network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)}
    outs = {network.get_output(i).name: tuple(network.get_output(i).shape) for i in range(network.num_outputs)}
    return ins, outs


def build_engine(args) -> bytes:
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile

    profile = Profile()
    for name, (mn, opt, mx) in profile_shapes(args).items():
        profile.add(name, min=mn, opt=opt, max=mx)
    network = NetworkFromOnnxPath(args.onnx)
    if args.stateful:  # the parsed network must have exactly the state layout's I/O
        network = network()
        want_in, want_out = expected_io(args.state_io)
        got_in, got_out = _network_io(network[1])
        problems = check_io(got_in, want_in, "input") + check_io(got_out, want_out, "output", dynamic_ok=True)
        if problems:
            raise RuntimeError(
                "the ONNX does not match the state layout of --checkpoint/--preset: " + "; ".join(problems)
            )
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
    build = EngineBytesFromNetwork(network, config=config, save_timing_cache=cache)
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
    if args.stateful:
        print(f"stateful: {len(args.state_io)} state inputs, each over batch {p.batch} with its fixed per-row dims")
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
