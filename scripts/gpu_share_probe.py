#!/usr/bin/env python
"""How much slower a stateful codec call gets while another process keeps the GPU busy.

In the service the talker (native engine) and the codec are two Triton stub processes on one
GPU. Without MPS the GPU time-slices between their CUDA contexts; with MPS their kernels may
share the SMs. This probe measures that effect alone, without Triton:

1. the stateful codec's CUDA-graph step (random real-size decoder, ``StatefulGraphRunner``) for
   each ``--calls`` shape ``BxT``, median ms over ``--iters`` calls (audio copied to the host, as
   the served model does), with the GPU otherwise idle;
2. the same while a second process replays a CUDA graph of bf16 GEMMs that takes ``--load-ms``
   alone, back to back with a host sync after each replay, as the talker's step loop does
   (6.5 ms: the compiled 1.7B talker step at batch 1; 8.9 ms at batch 64);
3. the load's own replay time alone and while the codec calls run.

    python scripts/gpu_share_probe.py --preset 1.7b-customvoice --calls 1x1 1x2 8x25 --load-ms 6.5

Start an MPS daemon first (``nvidia-cuda-mps-control -d``) to measure with MPS. Output: a table
and, with ``--json``, the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _load_role(args) -> int:
    """The competing process: replay a GEMM graph of about --load-ms, sync after each replay."""
    import torch

    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    for _ in range(3):
        torch.mm(x, a, out=y)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        torch.mm(x, a, out=y)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 20
    n = max(1, round(args.load_ms / 1000 / per))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.mm(x, a, out=y)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for i in range(n):
            torch.mm(x if i % 2 == 0 else y, a, out=y if i % 2 == 0 else x)

    def run(seconds, stop=None):
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end and not (stop and os.path.exists(stop)):
            t = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1000)
        return times

    run(0.5)
    alone = run(2.0)
    print("READY", flush=True)
    shared = run(args.seconds, stop=args.out + ".stop")  # until the probe is done
    with open(args.out, "w") as f:
        json.dump(
            {
                "gemms": n,
                "alone_ms": statistics.median(alone),
                "shared_ms": statistics.median(shared),
                "shared_p95_ms": sorted(shared)[int(0.95 * (len(shared) - 1))],
            },
            f,
        )
    return 0


def _codec_runner(args, torch):
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner

    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(cfg), 0).to("cuda", torch.bfloat16).eval()
    sd = StatefulCodecDecoder(dec)
    shapes = [tuple(int(v) for v in c.lower().split("x")) for c in args.calls]
    runner = StatefulGraphRunner(
        sd, "cuda", torch.bfloat16, sorted({b for b, _ in shapes}), sorted({t for _, t in shapes})
    )
    runner.warmup()
    return sd, runner, shapes, cfg.codebook_size


def _time_calls(sd, runner, shapes, size, iters, torch):
    out = {}
    for b, t in shapes:
        codes = torch.randint(0, size, (b, t, 16), device="cuda")
        state = sd.init_state(b, "cuda", torch.bfloat16)
        times = []
        for i in range(iters + 3):
            t0 = time.perf_counter()
            audio, _ = runner.step(codes, state)
            audio.float().cpu()
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.003)  # arrivals spread over the load's replays, as chunks arrive in service
        out[f"{b}x{t}"] = statistics.median(times)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--preset", default="1.7b-customvoice")
    ap.add_argument("--calls", nargs="+", default=["1x1", "1x2", "8x25", "64x25"], help="codec call shapes BxT")
    ap.add_argument("--load-ms", type=float, default=6.5, help="the competing graph's replay time alone")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--role", choices=["probe", "load"], default="probe", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for c in args.calls:
        parts = c.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            ap.error(f"--calls takes shapes like 1x2 or 8x25 (batch x frames), got {c!r}")
    if args.load_ms <= 0:
        ap.error("--load-ms must be > 0")

    import torch

    if not torch.cuda.is_available():
        print("error: this probe needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.role == "load":
        return _load_role(args)
    sd, runner, shapes, size = _codec_runner(args, torch)
    alone = _time_calls(sd, runner, shapes, size, args.iters, torch)
    seconds = 60.0 + 0.2 * args.iters * len(shapes)  # an upper bound: the probe stops it when done
    out_file = f"/tmp/gpu_share_probe_{os.getpid()}.json"
    child = subprocess.Popen(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--role",
            "load",
            "--load-ms",
            str(args.load_ms),
            "--seconds",
            str(seconds),
            "--out",
            out_file,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    if "READY" not in line:
        print(f"error: the load process did not start ({line!r})", file=sys.stderr)
        child.kill()
        return 1
    shared = _time_calls(sd, runner, shapes, size, args.iters, torch)
    Path(out_file + ".stop").touch()
    child.wait(timeout=seconds + 60)
    with open(out_file) as f:
        load = json.load(f)
    mps = os.path.exists(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps") + "/control")
    print(
        f"{torch.cuda.get_device_name()}; MPS daemon {'running' if mps else 'not running'}; "
        f"load: {load['gemms']} bf16 GEMMs 4096^3 per graph"
    )
    print(
        f"load replay alone {load['alone_ms']:.2f} ms, while the codec calls run {load['shared_ms']:.2f} ms "
        f"(p95 {load['shared_p95_ms']:.2f})"
    )
    print(f"{'codec call BxT':>15} {'alone ms':>9} {'shared ms':>10} {'x':>6}")
    for k in alone:
        print(f"{k:>15} {alone[k]:9.2f} {shared[k]:10.2f} {shared[k] / alone[k]:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "mps": mps,
                    "load": load,
                    "codec_alone_ms": alone,
                    "codec_shared_ms": shared,
                    "load_ms_target": args.load_ms,
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
