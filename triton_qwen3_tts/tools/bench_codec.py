"""Codec decoder throughput: audio-seconds of NEW audio per second, and ms per call.

For each backend present: torch eager, torch with CUDA graphs (one per batch size), optionally
torch.compile + graph, onnxruntime (CPU provider; give --onnx), and TensorRT (needs the `tensorrt`
package and a plan; not available on the development machines). Two decoding modes:

* windowed: each call decodes ``context + chunk`` frames and keeps the last ``chunk`` (the
  production path with left context; 72 + 25 by default);
* stateful: each call decodes only ``chunk`` new frames and carries conv tails and the attention
  KV ring as explicit state (triton_qwen3_tts.model.stateful_codec); exact.

Weights are random with the real shapes unless --checkpoint is given (timings carry over).
``qwen3-tts-bench-codec`` (also ``python benchmark/benchmark_codec.py``); needs the ``model`` extra (torch).

    qwen3-tts-bench-codec --device cuda --dtype bfloat16 --batch 1 8 32 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import TYPE_CHECKING, Dict, List

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import CodecDecoderConfig
from triton_qwen3_tts.tools._extras import import_model_extra

if TYPE_CHECKING:
    from triton_qwen3_tts.model.codec import CodecDecoder

torch = None  # the model extra: imported by main() once the command line is read, so --help needs none

SECONDS_PER_FRAME = 0.08


def build_decoder(args) -> CodecDecoder:
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights

    if args.checkpoint:
        from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder

        dec, _ = load_codec_decoder(args.checkpoint, "cpu")
    else:
        cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
        dec = init_random_codec_weights(CodecDecoder(cfg), 0)
    dtype = getattr(torch, args.dtype)
    return dec.to(args.device, dtype).eval()  # the rotary frequencies stay float32 (codec.py)


def timer(device):
    if device.startswith("cuda"):

        def run(fn, n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(n):
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            return statistics.median(times)
    else:

        def run(fn, n):
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1000)
            return statistics.median(times)

    return run


def make_windowed(dec, b, t, device, graph, compiled):
    codes = torch.randint(0, 2048, (b, t, 16), device=device)
    fwd = torch.compile(dec.decode, dynamic=False) if compiled else dec.decode
    if not graph:
        return lambda: fwd(codes)
    for _ in range(3):
        fwd(codes)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fwd(codes)
    return g.replay


def make_stateful(dec, b, t, device, graph, compiled):
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder

    sdec = StatefulCodecDecoder(dec)
    dtype = next(dec.parameters()).dtype
    state = sdec.init_state(b, device=device, dtype=dtype)
    codes = torch.randint(0, 2048, (b, t, 16), device=device)
    if compiled:  # as the serving runner compiles it: dynamic batch and frame dims
        from triton_qwen3_tts.serving.codec.graphs import compile_step

        step = compile_step(sdec.step)
    else:
        step = sdec.step

    def call():
        _, new = step(codes, state)
        for k, v in new.items():
            state[k].copy_(v)

    if not graph:
        return call
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    return g.replay


def main(argv=None) -> int:
    global torch
    p = argparse.ArgumentParser(prog="qwen3-tts-bench-codec", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="checkpoint dir (default: random weights of --preset)")
    p.add_argument(
        "--preset",
        default="1.7b-customvoice",
        choices=presets.PRESETS,
        metavar="PRESET",
        help="random weights of: " + ", ".join(presets.PRESETS) + " (default 1.7b-customvoice)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda when available, else cpu)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="float32 (default), bfloat16 or float16",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--chunk", type=int, default=25)
    p.add_argument("--context", type=int, default=72)
    p.add_argument(
        "--modes",
        nargs="+",
        default=["windowed", "stateful"],
        choices=["windowed", "stateful"],
        help="windowed and/or stateful (default both)",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        default=None,
        choices=["eager", "graph", "compile-graph", "onnxruntime", "tensorrt"],
        metavar="BACKEND",
        help="any of eager, graph, compile-graph, onnxruntime, tensorrt (default: eager, plus graph on CUDA)",
    )
    p.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="torch.backends.cudnn.benchmark on (cuDNN times its algorithms on each shape's first call)",
    )
    p.add_argument("--onnx", help="ONNX model for the onnxruntime backend (windowed)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", help="write results here")
    a = p.parse_args(argv)
    torch = import_model_extra("torch", "qwen3-tts-bench-codec")
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = a.device.startswith("cuda")
    backends = a.backends or (["eager", "graph"] if cuda else ["eager"])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = bool(a.cudnn_benchmark)
    dec = build_decoder(a)
    run = timer(a.device)
    rows: List[Dict] = []
    print(f"{'mode':9s} {'backend':13s} {'B':>3s} {'T':>4s} {'ms/call':>9s} {'audio-s/s':>10s}")
    for mode in a.modes:
        t = a.chunk + a.context if mode == "windowed" else a.chunk
        for backend in backends:
            for b in a.batch:
                try:
                    with torch.inference_mode():
                        if backend in ("eager", "graph", "compile-graph"):
                            if backend != "eager" and not cuda:
                                continue
                            mk = make_windowed if mode == "windowed" else make_stateful
                            fn = mk(dec, b, t, a.device, backend != "eager", backend == "compile-graph")
                        elif backend == "onnxruntime":
                            if mode != "windowed" or not a.onnx:
                                continue
                            import numpy as np
                            import onnxruntime as ort

                            sess = ort.InferenceSession(a.onnx, providers=["CPUExecutionProvider"])
                            x = np.random.randint(0, 2048, (b, t, 16)).astype(np.int64)
                            name = sess.get_inputs()[0].name
                            fn = lambda: sess.run(None, {name: x})  # noqa: E731
                        elif backend == "tensorrt":
                            try:
                                import tensorrt  # noqa: F401
                            except ImportError:
                                print("tensorrt: skipped (the `tensorrt` package is not installed)")
                                continue
                            raise NotImplementedError("time TensorRT with export/check_parity.py --bench")
                        else:
                            raise ValueError(f"unknown backend {backend}")
                        for _ in range(3):
                            fn()
                        ms = run(fn, a.iters)
                except torch.cuda.OutOfMemoryError:
                    print(f"{mode:9s} {backend:13s} {b:3d} {t:4d}  out of memory")
                    torch.cuda.empty_cache()
                    continue
                except Exception as e:  # noqa: BLE001 - report and go on with the other configs
                    print(f"{mode:9s} {backend:13s} {b:3d} {t:4d}  failed: {type(e).__name__}: {e}")
                    rows.append(dict(mode=mode, backend=backend, batch=b, frames=t, error=f"{type(e).__name__}: {e}"))
                    continue
                rate = b * a.chunk * SECONDS_PER_FRAME / (ms / 1000)
                rows.append(
                    dict(
                        mode=mode,
                        backend=backend,
                        batch=b,
                        frames=t,
                        new_frames=a.chunk,
                        ms_per_call=round(ms, 3),
                        audio_seconds_per_second=round(rate, 1),
                    )
                )
                print(f"{mode:9s} {backend:13s} {b:3d} {t:4d} {ms:9.2f} {rate:10.1f}", flush=True)
    meta = dict(
        device=torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        dtype=a.dtype,
        preset=a.preset if not a.checkpoint else a.checkpoint,
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d"),
        command=" ".join(sys.argv),
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
