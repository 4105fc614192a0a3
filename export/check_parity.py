#!/usr/bin/env python
"""Compare the TensorRT codec engine with onnxruntime (CPU) on shapes inside its profile.

    python export/check_parity.py [--onnx build/codec_decoder.onnx] \\
        [--engine model_repository/codec_decoder/1/model.plan] \\
        [--batch-profile 1 8 64] [--frames-profile 1 97 97] [--shapes 1x2,8x97,...] \\
        [--fp32] [--atol A] [--rtol R] [--mean-atol M]

Reference: onnxruntime CPUExecutionProvider running the exported fp32 ONNX model (itself checked
against PyTorch by export_codec_onnx.py). Inputs: random codes in [0, codebook_size), per shape.
Shapes default to the profile's corners, its OPT point and an odd middle point; pass the same
profile as build_trt_engine.py (or --shapes inside it).

Checks, all required to pass:

1. every TensorRT output is finite (no NaN/Inf);
2. polygraphy ``SimpleCompareFunc`` elementwise: |trt - ort| <= atol + rtol * |ort|;
3. mean |trt - ort| <= mean-atol for every shape;
4. per-row independence for batch > 1: each row run alone through TensorRT matches that row of
   the batched run within atol (TensorRT 10.x without the fusion barrier broke exactly this).

Tolerances (audio is clamped to [-1, 1]):

==========  ======  ======  =========
precision   atol    rtol    mean-atol
==========  ======  ======  =========
fp32        1e-3    0       1e-4
fp16        5e-2    0       5e-3
==========  ======  ======  =========

``--fp32`` selects the fp32 row (use it for engines built with ``--fp32``).

Stateful codec (``--stateful``, with ``--checkpoint DIR`` or ``--preset NAME`` for the state layout;
defaults ``--onnx build/codec_decoder_stateful.onnx --engine build/codec_decoder_stateful.plan``,
frames profile ``1 25 25``). Per shape, every row starts from a REAL state: row r first decodes
``row_positions(b)[r]`` frames (0 for row 0, up to 90: past the 71-frame KV window) through
onnxruntime; then TensorRT and onnxruntime decode the same new frames from that state. Checks:

1. every TensorRT output (audio and every ``state_out_*``) is finite;
2. audio: max |trt - ort| <= atol and mean <= mean-atol;
3. every float state output: max |trt - ort| / max(1, max |ort|) <= state-tol; ``state_out_pos``
   exactly equal;
4. per-row independence for batch > 1 (audio, atol);
5. a carried stream: 2 rows, 6 calls of the profile's OPT frames, each side feeding back its own
   state; audio and states of every call within the same tolerances (errors must not grow).

==========  ======  =========  =========
precision   atol    mean-atol  state-tol
==========  ======  =========  =========
fp32        1e-3    1e-4       1e-3
fp16        5e-2    5e-3       5e-2
==========  ======  =========  =========
Exit codes: 0 pass; 1 parity failed; 2 bad arguments; 3 TensorRT (python package ``tensorrt``)
is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from triton_qwen3_tts.export.stateful_trt import (  # noqa: E402
    DEFAULT_STATEFUL_ONNX_PATH,
    DEFAULT_STATEFUL_PLAN_PATH,
    STATEFUL_TOLERANCES,
    apply_mode_defaults,
    compare_state,
    row_positions,
    state_io_from_args,
)
from triton_qwen3_tts.export.codec_onnx import (  # noqa: E402
    DEFAULT_ONNX_PATH,
    DEFAULT_PLAN_PATH,
    EXIT_FAILED,
    EXIT_NO_TENSORRT,
    EXIT_OK,
    INPUT_NAME,
    OUTPUT_NAME,
    TENSORRT_MISSING,
    ShapeProfile,
    have_tensorrt,
    parse_shapes,
    random_codes,
)

TOLERANCES = {  # precision -> (atol, rtol, mean_atol)
    "fp32": (1e-3, 0.0, 1e-4),
    "fp16": (5e-2, 0.0, 5e-3),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument(
        "--stateful",
        action="store_true",
        help="check the stateful codec's engine (state I/O; needs --checkpoint or --preset)",
    )
    ap.add_argument("--checkpoint", default=None, help="--stateful: checkpoint directory giving the state layout")
    ap.add_argument("--preset", default=None, help="--stateful: presets.py name giving the state layout")
    ap.add_argument(
        "--onnx",
        default=None,
        help=f"reference ONNX (default {DEFAULT_ONNX_PATH}; --stateful: {DEFAULT_STATEFUL_ONNX_PATH})",
    )
    ap.add_argument(
        "--engine",
        default=None,
        help=f"TensorRT engine (default {DEFAULT_PLAN_PATH}; --stateful: {DEFAULT_STATEFUL_PLAN_PATH})",
    )
    ap.add_argument(
        "--batch-profile", type=int, nargs=3, metavar=("MIN", "OPT", "MAX"), default=None, help="default 1 8 64"
    )
    ap.add_argument(
        "--frames-profile",
        type=int,
        nargs=3,
        metavar=("MIN", "OPT", "MAX"),
        default=None,
        help="default 1 97 97; --stateful: 1 25 25",
    )
    ap.add_argument(
        "--state-tol",
        type=float,
        default=None,
        help="--stateful: override the state tolerance (relative to max(1, |state|))",
    )
    ap.add_argument("--shapes", default=None, help="comma list of BATCHxFRAMES inside the profile (default: derived)")
    ap.add_argument("--fp32", action="store_true", help="fp32 engine: use the fp32 tolerances")
    ap.add_argument("--atol", type=float, default=None, help="override the elementwise absolute tolerance")
    ap.add_argument("--rtol", type=float, default=None, help="override the elementwise relative tolerance")
    ap.add_argument("--mean-atol", type=float, default=None, help="override the mean |diff| tolerance")
    ap.add_argument("--codebook-size", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    st = args.stateful
    apply_mode_defaults(args, "engine")
    try:
        args.profile = ShapeProfile(tuple(args.batch_profile), tuple(args.frames_profile))
    except ValueError as e:
        ap.error(str(e))
    try:
        args.state_io = state_io_from_args(args, ("--checkpoint", "--preset", "--state-tol"))
    except ValueError as e:
        ap.error(str(e))
    if args.shapes:
        try:
            args.shape_list = parse_shapes(args.shapes)
        except ValueError as e:
            ap.error(f"--shapes: {e}")
        outside = [f"{b}x{t}" for b, t in args.shape_list if not args.profile.contains(b, t)]
        if outside:
            ap.error(
                f"--shapes outside the profile (batch {args.profile.batch}, frames {args.profile.frames}): "
                f"{', '.join(outside)}"
            )
    else:
        args.shape_list = args.profile.test_shapes()
    atol, rtol, mean_atol = TOLERANCES["fp32" if args.fp32 else "fp16"]
    if st:
        atol, mean_atol, state_tol = STATEFUL_TOLERANCES["fp32" if args.fp32 else "fp16"]
        args.state_tol = state_tol if args.state_tol is None else args.state_tol
        if not args.state_tol >= 0:
            ap.error(f"--state-tol must be >= 0, got {args.state_tol}")
    args.atol = atol if args.atol is None else args.atol
    args.rtol = rtol if args.rtol is None else args.rtol
    args.mean_atol = mean_atol if args.mean_atol is None else args.mean_atol
    for name in ("atol", "rtol", "mean_atol"):
        if not getattr(args, name) >= 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.codebook_size < 1:
        ap.error(f"--codebook-size must be >= 1, got {args.codebook_size}")
    for flag, path in (("--onnx", args.onnx), ("--engine", args.engine)):
        if not os.path.isfile(path):
            ap.error(f"{flag}: file not found: {path}")
    return args


def run_parity(args) -> bool:
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    feeds = [
        {INPUT_NAME: random_codes(b, t, args.codebook_size, args.seed + k)} for k, (b, t) in enumerate(args.shape_list)
    ]
    ort = OnnxrtRunner(SessionFromOnnx(args.onnx, providers=["cpu"]), name="onnxrt")
    engine = EngineFromBytes(BytesFromPath(args.engine))
    trt_runner = TrtRunner(engine, name="tensorrt")
    results = Comparator.run([ort, trt_runner], data_loader=feeds)

    ok = True
    (_, ort_iters), (_, trt_iters) = list(results.items())
    for (b, t), ref_it, got_it in zip(args.shape_list, ort_iters, trt_iters):
        ref, got = np.asarray(ref_it[OUTPUT_NAME]), np.asarray(got_it[OUTPUT_NAME])
        if not np.isfinite(got).all():
            print(f"FAIL batch={b} frames={t}: TensorRT output has {int((~np.isfinite(got)).sum())} NaN/Inf values")
            ok = False
            continue
        d = np.abs(got.astype(np.float64) - ref)
        good = d.mean() <= args.mean_atol
        ok &= bool(good)
        print(
            f"{'ok  ' if good else 'FAIL'} batch={b:3d} frames={t:4d} max_abs={d.max():.3e} "
            f"mean_abs={d.mean():.3e} p99={np.quantile(d, 0.99):.3e}"
        )

    acc = Comparator.compare_accuracy(
        results, compare_func=SimpleCompareFunc(atol=args.atol, rtol=args.rtol, check_error_stat="elemwise")
    )
    print(f"polygraphy elementwise (atol={args.atol}, rtol={args.rtol}): {'PASSED' if acc else 'FAILED'}")
    ok &= bool(acc)

    # Per-row independence inside TensorRT.
    with TrtRunner(engine, name="tensorrt-rows") as runner:
        for feed, (b, t) in zip(feeds, args.shape_list):
            if b < 2:
                continue
            codes = feed[INPUT_NAME]
            batched = np.array(runner.infer({INPUT_NAME: codes})[OUTPUT_NAME])
            worst = 0.0
            for i in range(b):
                alone = np.asarray(runner.infer({INPUT_NAME: np.ascontiguousarray(codes[i : i + 1])})[OUTPUT_NAME])[0]
                worst = max(worst, float(np.abs(alone.astype(np.float64) - batched[i]).max()))
            good = worst <= args.atol
            ok &= good
            print(
                f"{'ok  ' if good else 'FAIL'} rows batch={b:3d} frames={t:4d}: max |row alone - row in batch| = {worst:.3e}"
            )
    return ok


def _ort_session(path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("QWEN3_TTS_ORT_THREADS", "0"))
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_stateful_parity(args) -> bool:
    """The stateful checks of the module docstring (TensorRT vs onnxruntime, real states)."""
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    with TrtRunner(EngineFromBytes(BytesFromPath(args.engine)), name="tensorrt") as runner:

        def trt_run(feed):
            return {k: np.array(v) for k, v in runner.infer(feed).items()}  # copies: buffers are reused

        return stateful_checks(args, trt_run)


def stateful_checks(args, run_engine) -> bool:
    """Checks 1-5 of the module docstring with ``run_engine(feed) -> {output name: array}`` as the
    engine under test (TensorRT in :func:`run_stateful_parity`) and onnxruntime as the reference."""
    io = args.state_io
    out_names = [OUTPUT_NAME] + [s.output_name for s in io]
    sess = _ort_session(args.onnx)
    rng = np.random.default_rng(args.seed)

    def codes(b, t):
        return rng.integers(0, args.codebook_size, size=(b, t, 16), dtype=np.int64)

    def zero_state(b):
        return {s.input_name: np.zeros((b,) + s.row_shape, np.float32 if s.is_float else np.int64) for s in io}

    def ort_run(c, state):
        outs = sess.run(out_names, {INPUT_NAME: c, **state})
        return dict(zip(out_names, outs))

    def as_input(outs):  # state_out_* of one call -> state_in_* of the next
        return {s.input_name: np.ascontiguousarray(outs[s.output_name]) for s in io}

    states = {}

    def real_state(b):  # one per batch size (onnxruntime warm-up of every row is the slow part)
        if b not in states:
            states[b] = _real_state(b)
        return states[b]

    def _real_state(b):
        rows = []
        for p in row_positions(b):
            st = zero_state(1)
            if p:
                st = as_input(ort_run(codes(1, p), st))
            rows.append(st)
        return {n: np.concatenate([r[n] for r in rows]) for n in rows[0]}

    ok = True

    def check(label, ref, got):
        nonlocal ok
        a_ref, a_got = np.asarray(ref[OUTPUT_NAME]), np.asarray(got[OUTPUT_NAME])
        if a_got.shape != a_ref.shape or not np.isfinite(a_got).all():
            print(f"FAIL {label}: audio shape {list(a_got.shape)} (expected {list(a_ref.shape)}) or NaN/Inf")
            ok = False
            return
        d = np.abs(a_got.astype(np.float64) - a_ref)
        sd_err, problems = compare_state(ref, got, io)
        good = d.max() <= args.atol and d.mean() <= args.mean_atol and sd_err <= args.state_tol and not problems
        ok &= bool(good)
        print(
            f"{'ok  ' if good else 'FAIL'} {label}: audio max_abs={d.max():.3e} mean_abs={d.mean():.3e}; "
            f"state max_rel={sd_err:.3e}{'; ' + '; '.join(problems) if problems else ''}"
        )

    def trt_run(c, state):
        return run_engine({INPUT_NAME: c, **state})

    for b, t in args.shape_list:
        state, c = real_state(b), codes(b, t)
        ref, got = ort_run(c, state), trt_run(c, state)
        check(f"batch={b:3d} frames={t:4d} (rows at positions {row_positions(b)[:4]}...)", ref, got)
        if b > 1 and args.profile.batch[0] == 1:
            worst = 0.0
            for i in range(b):
                alone = trt_run(
                    np.ascontiguousarray(c[i : i + 1]),
                    {k: np.ascontiguousarray(v[i : i + 1]) for k, v in state.items()},
                )
                worst = max(
                    worst,
                    float(
                        np.abs(
                            np.asarray(alone[OUTPUT_NAME])[0].astype(np.float64) - np.asarray(got[OUTPUT_NAME])[i]
                        ).max()
                    ),
                )
            good = worst <= args.atol
            ok &= good
            print(
                f"{'ok  ' if good else 'FAIL'} rows batch={b:3d} frames={t:4d}: "
                f"max |row alone - row in batch| = {worst:.3e}"
            )

    # a carried stream: each side feeds back its own state
    b, t = max(args.profile.batch[0], min(2, args.profile.batch[2])), args.profile.frames[1]
    st_ref = st_got = zero_state(b)
    for k in range(6):
        c = codes(b, t)
        ref, got = ort_run(c, st_ref), trt_run(c, st_got)
        check(f"carried stream call {k + 1}/6 (batch {b}, {t} frames each)", ref, got)
        st_ref, st_got = as_input(ref), as_input(got)
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    if not have_tensorrt():
        print(f"error: {TENSORRT_MISSING}", file=sys.stderr)
        return EXIT_NO_TENSORRT
    print(
        f"engine {args.engine} vs onnxruntime {args.onnx}; shapes "
        f"{', '.join(f'{b}x{t}' for b, t in args.shape_list)}; atol={args.atol} rtol={args.rtol} "
        f"mean_atol={args.mean_atol}" + (f" state_tol={args.state_tol}" if args.stateful else "")
    )
    t0 = time.time()
    ok = run_stateful_parity(args) if args.stateful else run_parity(args)
    print(f"parity {'PASSED' if ok else 'FAILED'} ({time.time() - t0:.1f}s)")
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
