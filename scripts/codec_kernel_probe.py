#!/usr/bin/env python
"""The codec's residual-unit kernel (``serving/codec/kernels.py``) against the compiled torch unit,
one unit at a time, at the shapes of a codec call (default 32 streams x 25 new frames).

    python scripts/codec_kernel_probe.py [--batch 32] [--frames 25] [--channels 96 192] \\
        [--configs 64,32,64,4 128,64,64,8 ...] [--json out.json]

For each vocoder block of those channel counts (the 1.7B codec's blocks: 768, 384, 192 and 96
channels at 32, 160, 640 and 1920 samples a frame) and each dilation (1, 3, 9), random
weights (bf16, random SnakeBeta parameters), random activations and state:

* ``torch``: the unit as ``StatefulCodecDecoder``'s channels-last vocoder runs it (SnakeBeta,
  the state's concatenation, the k7 ``conv2d``, SnakeBeta, the k1 ``conv2d``, the residual add)
  through ``torch.compile`` with ``cudnn.benchmark``, timed as CUDA-graph replays;
* the kernel under each ``--configs`` entry ``BT,BK,BN,warps`` (``num_stages`` 2), timed the same
  way, with its output's and state's largest difference from the torch unit relative to the
  output's largest magnitude.

The microseconds are per unit call; a call has three units per block. A GPU script (the kernel
needs a CUDA device; on the CPU run ``tests/kernels_interp.py check_codec_residual_unit``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAMPLES_PER_FRAME = {768: 32, 384: 160, 192: 640, 96: 1920}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--channels", type=int, nargs="+", default=[192, 96], choices=sorted(SAMPLES_PER_FRAME))
    ap.add_argument("--dilations", type=int, nargs="+", default=[1, 3, 9])
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["64,32,64,4", "64,64,64,4", "128,32,64,8", "128,64,128,8", "64,64,128,8"],
        help="kernel tiles BT,BK,BN,num_warps",
    )
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench_cudagraph

    from triton_qwen3_tts.model.codec import ResidualUnit
    from triton_qwen3_tts.model.stateful_codec import _conv_step4, _snake4
    from triton_qwen3_tts.serving.codec.kernels import pack_unit, residual_unit

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)
    rows = []

    def unit_torch(ru, x4, past):
        r, s = _conv_step4(ru.conv1, _snake4(ru.act1, x4), past)
        return x4 + F.conv2d(_snake4(ru.act2, r), ru.conv2.conv.weight.unsqueeze(2), ru.conv2.conv.bias), s

    import torch._dynamo

    torch._dynamo.config.recompile_limit = 64  # one compile per (channels, dilation)
    compiled = torch.compile(unit_torch, dynamic=False)
    print(f"{'C':>4} {'d':>2} {'L':>6} {'config':>14} {'us':>8} {'x torch':>8} {'out rel':>9} {'state rel':>9}")
    for C in args.channels:
        L = args.frames * SAMPLES_PER_FRAME[C]
        for d in args.dilations:
            ru = ResidualUnit(C, d)
            with torch.no_grad():
                for n, p in ru.named_parameters():
                    if p.dim() == 3:  # conv weights [C, C, k]: init_random_codec_weights' scale
                        scale = 0.78 / (p.shape[1] * p.shape[2]) ** 0.5
                    else:  # biases; SnakeBeta's log alpha and log beta
                        scale = 0.3 if n.endswith(("alpha", "beta")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=g) * scale)
            ru = ru.to(dev, dt).eval()
            x = torch.randn(args.batch, L, C, generator=g).to(dev, dt)
            past = torch.randn(args.batch, C, 6 * d, generator=g).to(dev, dt)
            x4 = x.permute(0, 2, 1).unsqueeze(2)  # [B, C, 1, L] channels-last over x's memory
            with torch.inference_mode():
                ref, ref_state = compiled(ru, x4, past)
                us = do_bench_cudagraph(lambda: compiled(ru, x4, past)) * 1e3
                base = us
                ref_y = ref[:, :, 0].transpose(1, 2)  # [B, L, C]
                top = float(ref_y.float().abs().max())
                rows.append(dict(C=C, d=d, L=L, config="torch", us=us))
                print(f"{C:>4} {d:>2} {L:>6} {'torch':>14} {us:>8.1f}")
                pu = pack_unit(ru)
                for cfg in args.configs:
                    bt, bk, bn, warps = (int(v) for v in cfg.split(","))
                    try:
                        y, st = residual_unit(x, past, pu, bt=bt, bk=bk, bn=bn, num_warps=warps)
                        us = do_bench_cudagraph(
                            lambda: residual_unit(x, past, pu, bt=bt, bk=bk, bn=bn, num_warps=warps)
                        )
                        us *= 1e3
                    except Exception as e:  # a configuration the GPU cannot run (shared memory, registers)
                        print(f"{C:>4} {d:>2} {L:>6} {cfg:>14} failed: {type(e).__name__}: {str(e)[:120]}")
                        rows.append(dict(C=C, d=d, L=L, config=cfg, error=f"{type(e).__name__}: {e}"[:300]))
                        continue
                    rel = float((y.float() - ref_y.float()).abs().max()) / top
                    srel = float((st.float() - ref_state.float()).abs().max()) / max(
                        1.0, float(ref_state.float().abs().max())
                    )
                    rows.append(dict(C=C, d=d, L=L, config=cfg, us=us, speedup=base / us, rel=rel, state_rel=srel))
                    print(f"{C:>4} {d:>2} {L:>6} {cfg:>14} {us:>8.1f} {base / us:>8.2f} {rel:>9.2e} {srel:>9.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
