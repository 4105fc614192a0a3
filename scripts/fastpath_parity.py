"""Parity of the GPU fast paths against their exact fallbacks, on random real-size weights.

Talker step: two native models over ONE random talker, the fallback (``--base``, default eager
blocks) and the fast path (``--fast``, default the ``torch.compile``'d blocks), both bf16.
Teacher-forced: before each step the fast model's state, KV cache included, is overwritten with the
fallback's, both run the same step, and their 16 codes per row are compared; the fallback's output
drives the next step. So every one of ``rows x steps`` frames is compared from the same inputs,
and a single differing code never changes the inputs of the frames after it. Greedy and sampled
(temperature 0.9, top-k 50, the same per-row noise in both). The engine's Gumbel noise belongs to a candidate's rank in the
top-k, so where two candidates' logits are nearly tied (flat random-weight logits) a rounding
difference swaps their ranks and their noise: sampled agreement is a harsher measure than greedy.

Codec: the stateful decoder stepped through a CUDA-graph runner without and with
``compile_step``, the same code chunks (2, 4, 8, 16, then 25s) for ``--codec-streams`` streams;
the max and RMS audio difference between them, and each against an fp32 eager decode.

    python scripts/fastpath_parity.py --dtype bfloat16 --steps 250 --rows 8 --json out.json

CUDA only (inductor kernels). CPU tests check the same switches traced (tests/test_native_engine.py,
tests/test_stateful_graphs.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _talker(preset: str, dtype: torch.dtype, device: str):
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.config import Qwen3TTSConfig
    from triton_qwen3_tts.model.talker import Talker

    cfg = Qwen3TTSConfig.from_dict(presets.main_config(preset))
    torch.manual_seed(0)
    with torch.device(device):
        t = Talker(cfg.talker).to(dtype)
    with torch.no_grad():
        for name, p in t.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
    return t.eval()


def _model(talker, dtype: str, rows: int, knobs: dict, device: str):
    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig

    cfg = NativeEngineConfig(
        max_num_seqs=rows,
        max_model_len=1024,
        device=device,
        dtype=dtype,
        cuda_graphs=False,
        max_trailing_tokens=64,
        batch_buckets=(rows,),
        **knobs,
    )
    eng = NativeEngine(None, cfg, talker=talker)
    eng._load()
    return eng.model


def _init(m, rows: int, greedy: bool, ctx: int) -> None:
    from triton_qwen3_tts.engines.native.engine import hash_seed

    g = torch.Generator(device="cpu").manual_seed(1)
    dev = m.device
    S = m.h.shape[0]
    with torch.inference_mode():
        for t in m.state:
            t.zero_()
        m.h.copy_(torch.randn(S, m.D, generator=g).to(dev, m.dtype))
        m.c0.copy_(torch.randint(0, m.cb, (S,), generator=g).to(dev))
        m.pos.fill_(ctx)
        m.frame_idx.fill_(ctx // 2)
        m.ngen.fill_(ctx // 2)
        m.temp.fill_(0.9)
        m.sub_temp.fill_(0.9)
        m.top_k.fill_(50)
        m.sub_top_k.fill_(50)
        m.top_p.fill_(1.0)
        m.rep.fill_(1.05)
        m.min_new.fill_(2)
        m.greedy.fill_(greedy)
        m.sub_greedy.fill_(greedy)
        m.suppress_eos.fill_(True)
        m.live[:rows].fill_(1)
        m.key.copy_(torch.tensor([hash_seed(i) for i in range(S)], device=dev))
        m.k_cache.normal_(0, 1, generator=None)
        m.v_cache.normal_(0, 1)


def _copy_state(dst, src) -> None:
    for a, b in zip(dst.state, src.state):
        a.copy_(b)
    dst.k_cache.copy_(src.k_cache)
    dst.v_cache.copy_(src.v_cache)


def talker_parity(args, dtype: str) -> dict:
    dt = getattr(torch, dtype)
    talker = _talker(args.preset, dt, args.device)
    base = _model(talker, dtype, args.rows, json.loads(args.base), args.device)
    fast = _model(talker, dtype, args.rows, json.loads(args.fast), args.device)
    C = 1024
    out = {"dtype": dtype, "base": json.loads(args.base), "fast": json.loads(args.fast)}
    for mode in ("greedy", "sampled"):
        _init(base, args.rows, mode == "greedy", args.ctx)
        same = total = frames_same = 0
        c0_same = 0
        t0 = time.time()
        with torch.inference_mode():
            for i in range(args.steps):
                if base.pos.max().item() + 2 >= C:
                    _init(base, args.rows, mode == "greedy", args.ctx)
                _copy_state(fast, base)
                base.step(args.rows, C, False)
                fast.step(args.rows, C, False)
                a, b = base.out[: args.rows, :16], fast.out[: args.rows, :16]
                eq = a == b
                same += int(eq.sum())
                total += eq.numel()
                frames_same += int(eq.all(dim=1).sum())
                c0_same += int(eq[:, 0].sum())
        frames = args.rows * args.steps
        out[mode] = {
            "frames": frames,
            "codes_identical_pct": round(100.0 * same / total, 3),
            "frames_identical_pct": round(100.0 * frames_same / frames, 3),
            "c1_to_c15_identical_pct": round(100.0 * (same - c0_same) / (total - frames), 3),
            "seconds": round(time.time() - t0, 1),
        }
        print(f"talker {dtype} {mode}: {out[mode]}", flush=True)
    del base, fast, talker
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return out


def codec_parity(args) -> dict:
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner

    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(args.preset)["decoder_config"])
    dev = args.device
    cap = dev == "cuda"
    dec32 = init_random_codec_weights(CodecDecoder(cfg), 0).to(dev).eval()
    sd32 = StatefulCodecDecoder(dec32).eval()
    dec16 = init_random_codec_weights(CodecDecoder(cfg), 0).to(dev, torch.bfloat16).eval()
    sd16 = StatefulCodecDecoder(dec16).eval()
    B = args.codec_streams
    chunks = [2, 4, 8, 16] + [25] * 4
    fb = (2, 4, 8, 16, 25)  # the chunk sizes below: one graph each, batch bucket B only
    codes = torch.randint(0, 2048, (B, sum(chunks), 16), generator=torch.Generator().manual_seed(0)).to(dev)

    def decode(step_fn, sd, dtype):
        state = sd.init_state(B, dev, dtype)
        out, off = [], 0
        for n in chunks:
            a, state = step_fn(codes[:, off : off + n], state)
            out.append(a.float())
            off += n
        return torch.cat(out, dim=1)

    res = {"streams": B, "chunks": chunks}
    with torch.inference_mode():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        ref = decode(sd32.step, sd32, torch.float32)
    t0 = time.time()
    plain = StatefulGraphRunner(sd16, dev, torch.bfloat16, (B,), fb, capture=cap)
    plain.warmup()
    res["graph_capture_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    comp = StatefulGraphRunner(
        sd16, dev, torch.bfloat16, (B,), fb, capture=cap, compile=True, compile_backend=args.codec_backend
    )
    comp.warmup()  # each slot's capture times cuDNN's algorithms (StatefulGraphRunner._slot)
    res["compile_capture_s"] = round(time.time() - t0, 1)
    a = decode(plain.step, sd16, torch.bfloat16)
    b = decode(comp.step, sd16, torch.bfloat16)

    def diff(x, y):
        d = (x - y).abs()
        return {"max_abs": float(d.max()), "rms": float(d.pow(2).mean().sqrt())}

    res["ref_rms"] = float(ref.pow(2).mean().sqrt())
    res["compiled_vs_graph_bf16"] = diff(b, a)
    res["graph_bf16_vs_fp32_eager"] = diff(a, ref)
    res["compiled_bf16_vs_fp32_eager"] = diff(b, ref)
    print(f"codec: {res}", flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="1.7b-customvoice")
    p.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--steps", type=int, default=250, help="teacher-forced steps (frames = rows x steps)")
    p.add_argument("--ctx", type=int, default=300, help="talker context each row starts at")
    p.add_argument("--base", default="{}", help="NativeEngineConfig knobs of the fallback (JSON; default: eager)")
    p.add_argument(
        "--fast", default='{"compile": true}', help="knobs of the fast path (JSON; default: compiled blocks)"
    )
    p.add_argument("--codec-streams", type=int, default=16)
    p.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke run of this script)")
    p.add_argument("--codec-backend", default="inductor", help="torch.compile backend of the codec step")
    p.add_argument("--skip", nargs="*", default=[], choices=["talker", "codec"])
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("fastpath_parity: needs CUDA", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result = {"torch": torch.__version__, "gpu": gpu, "talker": []}
    if "talker" not in args.skip:
        for dt in args.dtype:
            result["talker"].append(talker_parity(args, dt))
    if "codec" not in args.skip:
        result["codec"] = codec_parity(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
