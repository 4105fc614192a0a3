#!/usr/bin/env python
"""Export the STATEFUL streaming codec decoder to ONNX and check onnxruntime parity.

    python export/export_codec_stateful_onnx.py --checkpoint /models/Qwen3-TTS-12Hz-1.7B-CustomVoice \\
        [--out build/codec_decoder_stateful.onnx] [--opset 18] [--atol 1e-4] [--skip-parity] \\
        [--no-trt-fusion-barrier]
    python export/export_codec_stateful_onnx.py --preset tiny      # random weights, no checkpoint

I/O (all with a dynamic ``batch`` axis 0; see docs/design/stateful-codec.md for the layout):

* inputs  ``audio_codes`` INT64 [batch, frames, 16] (NEW frames only), then one
  ``state_in_<name>`` per state tensor (FP32, ``state_in_pos`` INT64 [batch]);
* outputs ``audio_values`` FP32 [batch, frames*1920], then ``state_out_<name>`` in the same order.

The served model stays stateless: the caller feeds back ``state_out_*`` as the next call's
``state_in_*`` (a new stream starts from all-zero rows). Parity: a stream is decoded through
onnxruntime (CPU) chunk by chunk with the state carried through ORT, and compared with the
PyTorch whole-utterance decode; then rows at different positions are batched in one ORT call and
compared with their solo results.

TensorRT fusion barrier: the stateful graph has the same ``pre_transformer.output_proj ->
Transpose -> ConvTranspose`` site where TensorRT 10.x fused wrongly across rows in the windowed
codec (triton_qwen3_tts/export/codec_onnx.py). The CLI inserts the same ``Add(x, 0)`` barrier there by
default (numerically a no-op: the onnxruntime parity runs on the file with the barrier);
``--no-trt-fusion-barrier`` skips it. ``export/check_parity.py --stateful`` checks per-row
independence of the engine either way.

Exit codes: 0 ok; 1 parity failed; 2 bad arguments or missing checkpoint.
The ONNX file is a build artefact (under build/, git-ignored): never commit it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXIT_OK, EXIT_PARITY, EXIT_USAGE = 0, 1, 2
INPUT_NAME = "audio_codes"
OUTPUT_NAME = "audio_values"
DEFAULT_OUT = os.path.join("build", "codec_decoder_stateful.onnx")
DEFAULT_SCHEDULE = (1, 4, 25, 2, 25, 25, 13)  # mixed chunks; 95 frames: past the 72 window


def io_names(sd) -> Tuple[List[str], List[str]]:
    ins, outs = sd.onnx_state_names()
    return [INPUT_NAME] + ins, [OUTPUT_NAME] + outs


def export_stateful_onnx(
    decoder,
    path: str,
    opset: int = 18,
    example_batch: int = 2,
    example_frames: int = 11,
    trt_fusion_barrier: bool = False,
) -> str:
    """Export ``StatefulCodecDecoder(decoder)`` (fp32) with dynamic batch and frames axes;
    ``trt_fusion_barrier``: then insert the TensorRT fusion barrier (module docstring)."""
    import warnings

    import onnx
    import torch

    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder

    if opset < 18:
        raise ValueError(f"opset must be >= 18, got {opset}")
    sd = StatefulCodecDecoder(decoder.float().eval()).eval()
    in_names, out_names = io_names(sd)
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, decoder.config.codebook_size, (example_batch, example_frames, 16), generator=gen)
    # a non-trivial example state (positions differ per row) so nothing is specialised to zeros
    state = sd.init_state(example_batch)
    with torch.no_grad():
        _, state = sd.step(torch.randint(0, decoder.config.codebook_size, (example_batch, 3, 16), generator=gen), state)
    state["pos"] = state["pos"] + torch.arange(example_batch)
    flat = sd.flatten_state(state)
    dyn = {INPUT_NAME: {0: "batch", 1: "frames"}, OUTPUT_NAME: {0: "batch", 1: "samples"}}
    for n in in_names[1:] + out_names[1:]:
        dyn[n] = {0: "batch"}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript exporter deprecation / tracer warnings
        torch.onnx.export(
            sd,
            (codes, *flat),
            path,
            dynamo=False,
            opset_version=opset,
            do_constant_folding=True,
            input_names=in_names,
            output_names=out_names,
            dynamic_axes=dyn,
        )
    onnx.checker.check_model(onnx.load(path))
    if trt_fusion_barrier:
        from triton_qwen3_tts.export.codec_onnx import apply_trt_fusion_barrier_file

        apply_trt_fusion_barrier_file(path, path)
    return path


def ort_session(path: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("QWEN3_TTS_ORT_THREADS", "2"))
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def check_stateful_parity(
    decoder, path: str, schedule: Sequence[int] = DEFAULT_SCHEDULE, batch: int = 2, seed: int = 0, session=None
) -> dict:
    """Return ``{"stream_max_abs", "rows_max_abs", "frames"}``: ORT chunked (state carried through
    ORT) vs PyTorch whole decode; and rows at different positions batched vs solo ORT calls."""
    import torch

    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder

    sd = StatefulCodecDecoder(decoder.float().eval())
    sess = session or ort_session(path)
    in_names, out_names = io_names(sd)
    total = sum(schedule)
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, decoder.config.codebook_size, size=(batch, total, 16), dtype=np.int64)
    with torch.no_grad():
        ref = decoder.decode(torch.from_numpy(codes)).numpy()

    def run(c, flat):
        outs = sess.run(out_names, {n: v for n, v in zip(in_names, [c] + flat)})
        return outs[0], outs[1:]

    zero = [t.numpy() for t in sd.flatten_state(sd.init_state(batch))]
    flat, pieces, start = zero, [], 0
    for ch in schedule:
        a, flat = run(codes[:, start : start + ch], flat)
        pieces.append(a)
        start += ch
    stream_err = float(np.abs(np.concatenate(pieces, axis=1).astype(np.float64) - ref).max())

    # rows at different positions in one call == each row alone
    positions = [0, min(total - 5, 75)]
    new_t = 5
    row_states, solo = [], []
    for r, p in enumerate(positions[:batch]):
        st = [z[:1] for z in zero]
        if p:
            _, st = run(codes[r : r + 1, :p], st)
        row_states.append(st)
        a, _ = run(codes[r : r + 1, p : p + new_t], st)
        solo.append(a[0])
    stacked = [np.concatenate(ts, axis=0) for ts in zip(*row_states)]
    new_codes = np.stack([codes[r, p : p + new_t] for r, p in enumerate(positions[:batch])])
    both, _ = run(new_codes, stacked)
    rows_err = max(float(np.abs(both[r].astype(np.float64) - solo[r]).max()) for r in range(len(solo)))
    for r, p in enumerate(positions[:batch]):
        rows_err = max(
            rows_err, float(np.abs(both[r].astype(np.float64) - ref[r, p * 1920 : (p + new_t) * 1920]).max())
        )
    return {"stream_max_abs": stream_err, "rows_max_abs": rows_err, "frames": total}


def _load(args):
    import torch

    if args.checkpoint:
        from triton_qwen3_tts.export.codec_onnx import load_decoder_from_checkpoint

        return load_decoder_from_checkpoint(args.checkpoint)[0]
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig

    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    return init_random_codec_weights(CodecDecoder(cfg), args.seed).float().eval().to(torch.device("cpu"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="Qwen3-TTS checkpoint directory (official layout)")
    src.add_argument("--preset", help="random weights of a presets.py size (e.g. tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument(
        "--no-trt-fusion-barrier",
        action="store_true",
        help="do not insert the TensorRT fusion barrier (see the module docstring)",
    )
    args = ap.parse_args(argv)
    if args.checkpoint and not os.path.isdir(args.checkpoint):
        print(f"error: checkpoint directory not found: {args.checkpoint}", file=sys.stderr)
        return EXIT_USAGE
    if args.opset < 18:
        print("error: --opset must be >= 18", file=sys.stderr)
        return EXIT_USAGE
    dec = _load(args)
    t0 = time.time()
    export_stateful_onnx(dec, args.out, args.opset, trt_fusion_barrier=not args.no_trt_fusion_barrier)
    print(
        f"exported {args.out} in {time.time() - t0:.1f}s"
        + ("" if args.no_trt_fusion_barrier else " (with the TensorRT fusion barrier)")
    )
    if args.skip_parity:
        return EXIT_OK
    r = check_stateful_parity(dec, args.out)
    ok = r["stream_max_abs"] <= args.atol and r["rows_max_abs"] <= args.atol
    print(
        f"parity {'OK' if ok else 'FAILED'}: stream max_abs={r['stream_max_abs']:.3e} "
        f"rows max_abs={r['rows_max_abs']:.3e} frames={r['frames']} atol={args.atol:.1e}"
    )
    return EXIT_OK if ok else EXIT_PARITY


if __name__ == "__main__":
    raise SystemExit(main())
