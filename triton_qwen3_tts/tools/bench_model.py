"""Talker-only serving benchmark (talker + code predictor, no codec): a concurrency sweep over
the native or the vLLM engine with fixed-length requests (EOS suppressed). ``qwen3-tts-bench-model``
(also ``python benchmark/benchmark_model.py``); needs the ``model`` extra (torch).

For each concurrency c: c closed-loop clients each run ``--rounds`` requests back to back;
prompts come from the real prompt builder (``PromptFrontend``) of the checkpoint. Reported per
level: time to first frame (TTFF) and inter-frame latency (ITL) mean/p50/p95/p99 (ms), frames/s,
audio-seconds/s (frames x 0.08 s / wall), requests/s.

``--profile-step`` (native, CUDA): one decode step per batch bucket timed with CUDA events, the
whole step and its three parts (talker = next-input embedding + backbone + codec head; code
predictor = 15 steps incl. residual sampling; sampling = codebook-0 processing/sampling + state
update), each captured in its own CUDA graph, as the H100 yardstick did.

    qwen3-tts-bench-model --checkpoint DIR --engine native --device cuda \
        --dtype bfloat16 --concurrency 1 8 32 64 --frames 200 --json out.json
    qwen3-tts-bench-model --checkpoint DIR --engine native --device cuda \
        --dtype bfloat16 --profile-step --profile-ctx 300
    qwen3-tts-bench-model --smoke          # CI: tiny random checkpoint, CPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from triton_qwen3_tts.engines.native.options import DECODE_ATTENTION_MODES, KERNELS, PDL_MODES
from triton_qwen3_tts.tools._extras import import_model_extra

torch = None  # the model extra: imported once the command line is read (parse_args), so --help needs none


def _import_torch() -> None:
    global torch
    torch = import_model_extra("torch", "qwen3-tts-bench-model")


SECONDS_PER_FRAME = 0.08
TEXTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
    "Streaming speech synthesis needs a low time to first audio and a steady frame rate.",
    "Please remember to bring your umbrella tomorrow, because the forecast says it will rain.",
    "In the beginning the universe was created, which made a lot of people very angry.",
]


def pct(xs: List[float], q: float) -> float:
    if not xs:
        return float("nan")
    return float(np.percentile(np.asarray(xs), q))


def summarise(xs: List[float]) -> Dict[str, float]:
    return {
        "mean": float(statistics.fmean(xs)) if xs else float("nan"),
        "p50": pct(xs, 50),
        "p95": pct(xs, 95),
        "p99": pct(xs, 99),
    }


# ------------------------------------------------------------------------------------------------
# prompts
# ------------------------------------------------------------------------------------------------


def build_prompts(checkpoint: str, n: int = 4):
    """[(prompt_embeds [L, D], trailing [N, D])] from the checkpoint's own prompt builder."""
    from triton_qwen3_tts.model.frontend import PromptFrontend
    from triton_qwen3_tts.model.prompt import PromptRequest

    fe = PromptFrontend(checkpoint)
    cfg = fe.config
    task = cfg.task_type
    D = cfg.talker.hidden_size
    out = []
    rng = np.random.default_rng(0)
    for i in range(n):
        text = TEXTS[i % len(TEXTS)]
        sv = None
        if task == "CustomVoice":
            spk = sorted(cfg.talker.spk_id)[i % len(cfg.talker.spk_id)]
            req = PromptRequest(task_type=task, text=text, language="english", speaker=spk)
        elif task == "VoiceDesign":
            req = PromptRequest(
                task_type=task, text=text, language="english", instruct="A warm, calm female voice, speaking slowly."
            )
        else:  # Base: x-vector-only cloning with a random speaker vector
            req = PromptRequest(task_type=task, text=text, language="english", x_vector_only=True)
            sv = (rng.standard_normal(D) * 0.02).astype(np.float32)
        b = fe.build(fe.validate(req), speaker_vector=sv)
        out.append((b.prompt_embeds.float().clone(), b.trailing.float().clone()))
    return out


# ------------------------------------------------------------------------------------------------
# engines
# ------------------------------------------------------------------------------------------------


def random_talker(args):
    """A random-weight reference Talker of a real-size preset, built on the device (no files)."""
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.config import Qwen3TTSConfig
    from triton_qwen3_tts.model.talker import Talker

    cfg = Qwen3TTSConfig.from_dict(presets.main_config(args.random_preset))
    torch.manual_seed(0)
    with torch.device(args.device):
        t = Talker(cfg.talker).to(getattr(torch, args.dtype))
    with torch.no_grad():  # N(0, 0.02) as init_random_weights, drawn on the device (fast)
        for name, prm in t.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
            elif name.endswith(".bias"):
                prm.zero_()
            else:
                prm.normal_(0.0, 0.02)
    return t.eval(), cfg


def random_prompts(D: int, n: int = 4):
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(24 + 4 * i, D, generator=g) * 0.05, torch.randn(12 + 3 * i, D, generator=g) * 0.05)
        for i in range(n)
    ]


def native_knobs(args) -> dict:
    """NativeEngineConfig A/B knobs from the command line (defaults: the engine's)."""
    kw = dict(
        fuse_weights=not args.no_fuse,
        skip_top_p=not args.no_skip_top_p,
        compile=args.compile,
        batched_prefill=not args.no_batched_prefill,
        overlap_steps=not args.no_overlap,
        prefill_max_tokens=args.prefill_max_tokens,
        kernels=args.kernels,
    )
    if args.no_prefill_graphs:
        kw["prefill_graphs"] = False
    if args.pdl is not None:
        kw["pdl"] = args.pdl
    if args.split_k is not None:
        kw["split_k"] = args.split_k
    if args.prefill_kernel_rows is not None:
        kw["prefill_kernel_rows"] = args.prefill_kernel_rows
    if args.exact_math:
        kw["fast_math"] = False
    if args.batch_buckets:
        kw["batch_buckets"] = tuple(args.batch_buckets)
    return kw


async def make_engine(args, max_num_seqs: int):
    if args.engine == "native":
        from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig

        cfg = NativeEngineConfig(
            max_num_seqs=max_num_seqs,
            max_model_len=args.max_model_len,
            device=args.device,
            dtype=args.dtype,
            cuda_graphs=not args.no_graphs,
            max_trailing_tokens=args.max_trailing,
            **native_knobs(args),
        )
        t0 = time.perf_counter()
        talker = random_talker(args)[0] if args.random_preset else None
        eng = await NativeEngine.create(args.checkpoint, cfg, talker=talker)
        print(
            f"native engine ready in {time.perf_counter() - t0:.1f} s "
            f"(graph capture {eng.capture_seconds:.1f} s; buckets {cfg.batch_sizes()} x ctx {cfg.ctx_sizes()})",
            flush=True,
        )
        return eng
    from triton_qwen3_tts.engines.vllm.engine import EngineConfig, TalkerEngine

    kv = None if args.device.startswith("cuda") else 256 * 2**20
    cfg = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        enforce_eager=args.no_graphs,
        kv_cache_memory_bytes=kv,
        max_trailing_tokens=args.max_trailing,
    )
    return await TalkerEngine.create(args.checkpoint, cfg)


async def one_request(engine, rid: str, prompt, trailing, frames: int, seed: int) -> dict:
    from triton_qwen3_tts.engines.base import TalkerRequest

    req = TalkerRequest(
        request_id=rid, prompt_embeds=prompt, trailing=trailing, max_frames=frames, seed=seed, suppress_eos=True
    )
    t0 = time.perf_counter()
    times: List[float] = []
    n = 0
    async for chunk in engine.synthesize(req):
        t = time.perf_counter()
        times.extend([t] * len(chunk))
        n += len(chunk)
    if n != frames:
        raise RuntimeError(f"{rid}: got {n} frames, expected {frames} (EOS suppressed)")
    return {"t0": t0, "ttff": times[0] - t0, "itl": list(np.diff(times)), "end": times[-1], "frames": n}


async def run_level(engine, prompts, c: int, frames: int, rounds: int, bar) -> dict:
    results = []

    async def client(k: int):
        for r in range(rounds):
            p, tr = prompts[(k + r) % len(prompts)]
            res = await one_request(engine, f"c{c}-{k}-{r}", p, tr, frames, seed=k * 1000 + r)
            results.append(res)
            if bar is not None:
                bar.update(1)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(c)))
    wall = time.perf_counter() - t0
    nf = sum(r["frames"] for r in results)
    ttff = [r["ttff"] * 1e3 for r in results]
    itl = [x * 1e3 for r in results for x in r["itl"]]
    return {
        "concurrency": c,
        "requests": len(results),
        "frames_per_request": frames,
        "wall_s": wall,
        "ttff_ms": summarise(ttff),
        "itl_ms": summarise(itl),
        "frames_per_s": nf / wall,
        "audio_s_per_s": nf * SECONDS_PER_FRAME / wall,
        "req_per_s": len(results) / wall,
    }


async def sweep(args) -> dict:
    if args.random_preset:
        from triton_qwen3_tts.model import presets

        prompts = random_prompts(presets.main_config(args.random_preset)["talker_config"]["hidden_size"])
    else:
        prompts = build_prompts(args.checkpoint)
    lens = [(int(p.shape[0]), int(t.shape[0])) for p, t in prompts]
    print(f"prompts (L, trailing): {lens}", flush=True)
    engine = await make_engine(args, args.max_num_seqs or max(args.concurrency))
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    levels = []
    try:
        await one_request(engine, "warmup", *prompts[0], min(args.frames, 8), seed=0)
        for c in args.concurrency:
            bar = tqdm(total=c * args.rounds, desc=f"c={c}", leave=False) if tqdm else None
            lv = await run_level(engine, prompts, c, args.frames, args.rounds, bar)
            if bar is not None:
                bar.close()
                print(flush=True)
            levels.append(lv)
            print(
                f"c={c:4d}  TTFF p50 {lv['ttff_ms']['p50']:8.1f} ms p99 {lv['ttff_ms']['p99']:8.1f}  "
                f"ITL mean {lv['itl_ms']['mean']:7.2f} p50 {lv['itl_ms']['p50']:7.2f} "
                f"p95 {lv['itl_ms']['p95']:7.2f} p99 {lv['itl_ms']['p99']:7.2f} ms  "
                f"{lv['frames_per_s']:9.1f} frames/s  {lv['audio_s_per_s']:8.1f} audio-s/s  "
                f"{lv['req_per_s']:6.2f} req/s",
                flush=True,
            )
        extra = {}
        if args.engine == "native":
            extra = {
                "stats": engine.stats(),
                "step_hist": {f"{b}x{c}": n for (b, c), n in engine.step_hist.items()},
                "capture_s": engine.capture_seconds,
            }
    finally:
        engine.shutdown()
    return {"levels": levels, "prompt_lengths": lens, **extra}


# ------------------------------------------------------------------------------------------------
# --profile-step (native, CUDA)
# ------------------------------------------------------------------------------------------------


def fill_random_state(m, ctx0: int, top_p: float, g) -> None:
    """Fill a NativeModel's slot tables for a timed decode step: random hidden states, codes and
    KV cache at context ``ctx0``, sampled (not greedy) rows with ``top_p``, drawn from the CPU
    generator ``g``. The step's outputs are then valid codes, its timing that of a real step."""
    from triton_qwen3_tts.engines.native.engine import hash_seed

    dev = m.device
    S = m.h.shape[0]  # slots + the scratch slot
    m.h.copy_((torch.randn(S, m.D, generator=g)).to(dev, m.dtype))
    m.c0.copy_(torch.randint(0, m.cb, (S,), generator=g).to(dev))
    m.pos.fill_(ctx0)
    m.frame_idx.fill_(ctx0 // 2)
    m.ngen.fill_(ctx0 // 2)
    m.n_trailing.fill_(0)
    m.presence.zero_()
    m.presence[:, :200] = True
    m.temp.fill_(0.9)
    m.sub_temp.fill_(0.9)
    m.top_k.fill_(50)
    m.sub_top_k.fill_(50)
    m.top_p.fill_(top_p)
    m.rep.fill_(1.05)
    m.min_new.fill_(2)
    m.greedy.zero_()
    m.sub_greedy.zero_()
    m.suppress_eos.fill_(True)
    m.key.copy_(torch.tensor([hash_seed(i) for i in range(S)], device=dev))
    m.k_cache.normal_(0, 1)
    m.v_cache.normal_(0, 1)


def profile_step(args) -> dict:
    """Time one decode step per batch bucket, whole and in three parts, each its own graph."""
    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig

    if not args.device.startswith("cuda"):
        raise SystemExit("--profile-step needs --device cuda")
    B_max = args.max_num_seqs or max(args.concurrency)
    cfg = NativeEngineConfig(
        max_num_seqs=B_max,
        max_model_len=args.max_model_len,
        device=args.device,
        dtype=args.dtype,
        cuda_graphs=False,
        max_trailing_tokens=args.max_trailing,
        **native_knobs(args),
    )
    eng = NativeEngine(args.checkpoint, cfg, talker=random_talker(args)[0] if args.random_preset else None)
    eng._load()
    m = eng.model
    ctx0 = args.profile_ctx
    C = min(c for c in cfg.ctx_sizes() if c >= ctx0 + 2)
    dev = m.device
    g = torch.Generator(device="cpu").manual_seed(0)

    def reset_state():
        fill_random_state(m, ctx0, args.profile_top_p, g)

    reset_state()
    tp = args.profile_top_p < 1.0  # the graph variant the engine would pick for these requests
    parts = {
        "full": lambda b: m.step(b, C, tp),
        "talker": lambda b: m.part_talker(b, C),
        "code_predictor": lambda b: m.part_code_predictor(b, tp),
        "sampling": lambda b: m.part_sample(b, tp),
    }
    rows = []
    pool = None
    keep = []  # graphs sharing a pool must stay alive while the pool is reused
    for B in cfg.batch_sizes():
        row = {"B": B, "ctx": ctx0, "ctx_bucket": C}
        for name, fn in parts.items():
            with torch.inference_mode():
                s = torch.cuda.Stream(device=dev)
                s.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(s):
                    for _ in range(3):
                        fn(B)
                torch.cuda.current_stream(dev).wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    fn(B)
                pool = graph.pool()
            times = []
            for i in range(args.profile_iters + 10):
                m.pos.fill_(ctx0)  # keep the context fixed (outside the timed region)
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                st.record()
                graph.replay()
                en.record()
                en.synchronize()
                if i >= 10:
                    times.append(st.elapsed_time(en))
            row[name] = float(statistics.median(times))
            keep.append(graph)
            if name == "full" and B in (args.profile_kernels or ()):
                row["kernels"] = profile_kernels(graph, args.profile_iters, before=lambda: m.pos.fill_(ctx0))
        # self-checks on the last full replays
        with torch.inference_mode():
            m.pos.fill_(ctx0)
            m.step(B, C, tp)
        fr = m.out[:B, :16]
        assert bool(torch.isfinite(m.h[:B].float()).all()), "non-finite hidden state"
        assert bool(((fr >= 0) & (fr < 2048)).all()), "codes out of range"
        row["audio_s_per_s"] = B * SECONDS_PER_FRAME / (row["full"] / 1e3)
        rows.append(row)
    print(
        f"\nper-frame step, context {ctx0} (bucket {C}), {args.dtype}, median of {args.profile_iters} "
        f"CUDA-event-timed graph replays; parts captured as separate graphs; knobs {native_knobs(args)}"
    )
    print(
        f"{'B':>4} {'full ms':>9} {'talker':>9} {'code pred':>10} {'sampling':>9} {'sum parts':>10} "
        f"{'audio-s/s':>10} {'RTF':>7}"
    )
    for r in rows:
        s = r["talker"] + r["code_predictor"] + r["sampling"]
        print(
            f"{r['B']:>4} {r['full']:>9.3f} {r['talker']:>9.3f} {r['code_predictor']:>10.3f} "
            f"{r['sampling']:>9.3f} {s:>10.3f} {r['audio_s_per_s']:>10.1f} {r['full'] / 80.0:>7.3f}"
        )
    for r in rows:
        if "kernels" in r:
            print_kernel_table(r["B"], r["full"], r["kernels"])
    prefill_rows = profile_prefill(args, m, cfg) if args.profile_prefill else []
    out = {"profile_step": rows, "profile_prefill": prefill_rows, "knobs": native_knobs(args)}
    if args.cp_parity:
        out["cp_parity"] = cp_parity(m, cfg, args.cp_parity, batch=args.cp_parity_rows)
    return out


def kernel_table(events, replays: int, top: int = 30) -> dict:
    """Per-step kernel figures from profiler events ``(name, device_us)`` of ``replays`` step
    replays: kernels per step, their summed time per step (ms; the GPU is idle for the rest of
    the step's wall time: launch gaps between kernels), and the ``top`` kernel names by time,
    each with its launches and microseconds per step."""
    by: Dict[str, List[float]] = {}
    for name, us in events:
        by.setdefault(name, []).append(float(us))
    rows = sorted(
        ({"name": n, "per_step": len(v) / replays, "us_per_step": sum(v) / replays} for n, v in by.items()),
        key=lambda r: -r["us_per_step"],
    )
    return {
        "kernels_per_step": sum(len(v) for v in by.values()) / replays,
        "busy_ms_per_step": sum(sum(v) for v in by.values()) / replays / 1e3,
        "top": rows[:top],
    }


def profile_kernels(graph, replays: int, before=None) -> dict:
    """:func:`kernel_table` of ``replays`` replays of a captured step ``graph`` under
    ``torch.profiler`` (CUDA activity: each kernel of the graph with its device time)."""
    from torch.profiler import ProfilerActivity, profile

    def replay(n: int) -> None:
        for _ in range(n):
            if before:
                before()
            graph.replay()
        torch.cuda.synchronize()

    replay(3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay(replays)
    events = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.name and not e.name.startswith("Memset"):
            us = getattr(e, "device_time", None)
            if us is None:
                us = e.cuda_time
            events.append((e.name, us))
    # the replays' ``pos.fill_`` (``before``, an int64 fill) is not the step's; the step's own
    # fills (a float mask) stay
    events = [(n, us) for n, us in events if "FillFunctor<long>" not in n]
    return kernel_table(events, replays)


def print_kernel_table(B: int, wall_ms: float, kt: dict) -> None:
    busy = kt["busy_ms_per_step"]
    print(
        f"\nB={B}: {kt['kernels_per_step']:.0f} kernels per step, {busy:.3f} ms of kernel time in a "
        f"{wall_ms:.3f} ms step (GPU idle {max(0.0, 1 - busy / wall_ms):.0%} of it: launch gaps)"
    )
    print(f"{'us/step':>9} {'launches':>9} {'us each':>8}  kernel")
    for r in kt["top"]:
        each = r["us_per_step"] / r["per_step"] if r["per_step"] else 0.0
        print(f"{r['us_per_step']:>9.1f} {r['per_step']:>9.1f} {each:>8.2f}  {r['name'][:110]}")


def cp_parity(m, cfg, frames: int, batch: int = 0) -> dict:
    """The code predictor's two implementations (``kernels`` torch and triton) on the same
    weights and the same random (h, c0) rows, ``frames`` frames in batches of the model's slot
    count: the share of identical residual codes, greedy and sampled (the same counter-based
    noise, which is indexed by candidate rank, so a near-tie that swaps two ranks changes the
    draw). Greedy codes are also compared with an fp32 reference (the torch blocks in exact
    math on an fp32 copy of the weights) where the model is not fp32 already. Eager calls (no
    graphs); the compiled blocks where ``cfg.compile``."""
    import copy
    from dataclasses import replace

    import torch

    from triton_qwen3_tts.engines.native.model import NativeModel

    other = "torch" if cfg.kernels == "triton" else "triton"
    small = replace(cfg, kernels=other, max_model_len=8, max_trailing_tokens=1)  # no big KV cache
    models = {cfg.kernels: m, other: NativeModel(m.talker, small, 0)}
    if m.dtype != torch.float32:
        ref_cfg = replace(small, kernels="torch", dtype="float32", fast_math=False, compile=False)
        models["fp32"] = NativeModel(copy.deepcopy(m.talker).float(), ref_cfg, 0)
    B = batch or m.S
    g = torch.Generator(device="cpu").manual_seed(3)
    res = {}
    for greedy in (True, False):
        pairs = [("torch", "triton")] + ([("torch", "fp32"), ("triton", "fp32")] if greedy and "fp32" in models else [])
        same = dict.fromkeys(pairs, 0)
        total = 0
        for it in range((frames + B - 1) // B):
            h = torch.randn(B, m.D, generator=g) * 0.5
            c0 = torch.randint(0, m.cb, (B,), generator=g).to(m.device)
            codes = {}
            for k, mm in models.items():
                if k == "fp32" and not greedy:
                    continue
                mm.h[:B].copy_(h.to(m.dtype).to(mm.dtype))  # the same (rounded) inputs for all
                mm.c0[:B].copy_(c0)
                mm.frame_idx[:B].fill_(it)
                mm.key[:B].copy_(torch.arange(B, device=m.device) * 7919 + it)
                mm.sub_greedy[:B].fill_(greedy)
                mm.sub_temp[:B].fill_(0.9)
                mm.sub_top_k[:B].fill_(50)
                mm.sub_top_p[:B].fill_(1.0)
                with torch.inference_mode():
                    mm.part_code_predictor(B, top_p=False)
                codes[k] = mm.frames[:B, 1:].clone()
            for a, b in pairs:
                same[(a, b)] += int((codes[a] == codes[b]).sum())
            total += codes["torch"].numel()
        res["greedy" if greedy else "sampled"] = {
            "codes": total,
            "identical_share": same[("torch", "triton")] / total,
            **{f"{a}_vs_fp32": same[(a, b)] / total for a, b in pairs if b == "fp32"},
        }
    gr = res["greedy"]
    ref = (
        f"; against fp32 exact math: torch {gr['torch_vs_fp32']:.4f}, triton {gr['triton_vs_fp32']:.4f}"
        if "torch_vs_fp32" in gr
        else ""
    )
    print(
        f"code predictor triton vs torch ({m.dtype}, {frames} frames x {m.R} residual codes): identical "
        f"greedy {gr['identical_share']:.4f}, sampled {res['sampled']['identical_share']:.4f}{ref}",
        flush=True,
    )
    return res


def profile_prefill(args, m, cfg) -> list:
    """Batched prefill per (P, L) bucket: one captured ``prefill_rows`` each, CUDA-event timed
    (what a burst of P new requests of <= L prompt rows costs before their first decode step)."""
    dev = m.device
    rows = []
    pool = None
    keep = []
    for L in args.profile_prefill:
        for P in cfg.prefill_batch_sizes():
            if P * L > cfg.prefill_max_tokens or L > cfg.max_model_len - 2:
                continue
            m.pf_x[: P * L * m.D].normal_(0, 0.05)
            m.pf_slots[:P].copy_(torch.arange(P, device=dev))
            m.pf_last[:P].fill_(L - 1)
            with torch.inference_mode():
                s = torch.cuda.Stream(device=dev)
                s.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(s):
                    for _ in range(2):
                        m.prefill_rows(P, L)
                torch.cuda.current_stream(dev).wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    m.prefill_rows(P, L)
                pool = graph.pool()
            keep.append(graph)
            times = []
            for i in range(max(10, args.profile_iters // 4) + 3):
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                st.record()
                graph.replay()
                en.record()
                en.synchronize()
                if i >= 3:
                    times.append(st.elapsed_time(en))
            rows.append({"P": P, "L": L, "ms": float(statistics.median(times))})
    if rows:
        print(f"\nbatched prefill (captured), {args.dtype}, median ms per call")
        print(f"{'P':>4} {'L':>6} {'ms':>9} {'ms/request':>11}")
        for r in rows:
            print(f"{r['P']:>4} {r['L']:>6} {r['ms']:>9.3f} {r['ms'] / r['P']:>11.3f}")
    return rows


# ------------------------------------------------------------------------------------------------
# --check (native): graphs == eager, and the reference loop
# ------------------------------------------------------------------------------------------------


def check(args) -> dict:
    """Greedy, concurrent, staggered requests on (a) eager and (b) CUDA-graph engines: frames must
    be identical; both are also compared with the reference ``generate_codes`` on the same
    device/dtype (exact match expected only with fast_math off and fp32)."""
    from triton_qwen3_tts.engines.base import TalkerRequest
    from triton_qwen3_tts.model.generate import generate_codes
    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig
    from triton_qwen3_tts.model.sampling import SamplingParams

    if args.random_preset:
        talker, tcfg = random_talker(args)
        pad_id = tcfg.tts_pad_token_id
    else:
        from triton_qwen3_tts.model.checkpoint import load_checkpoint

        ck = load_checkpoint(
            args.checkpoint,
            device=args.device,
            dtype=getattr(torch, args.dtype),
            load_speech_tokenizer=False,
            load_tokenizer=False,
        )
        talker, pad_id = ck.model.talker.eval(), ck.config.tts_pad_token_id
    D = talker.config.hidden_size
    g = torch.Generator().manual_seed(1)
    specs = [(9, 3, 14), (5, 0, 6), (17, 7, 20), (3, 12, 9), (12, 1, 11), (7, 4, 8)]
    prompts = [(torch.randn(L, D, generator=g) * 0.05, torch.randn(N, D, generator=g) * 0.05, mf) for L, N, mf in specs]
    with torch.no_grad():
        pad = talker.embed_text(torch.tensor([pad_id], device=talker.codec_head.weight.device))[0]
        refs = [
            generate_codes(
                talker, p, t, pad, SamplingParams(do_sample=False, subtalker_dosample=False, max_new_tokens=mf + 1)
            ).numpy()
            for p, t, mf in prompts
        ]

    async def run(graphs: bool, fast, compiled=False, kernels="torch"):
        cfg = NativeEngineConfig(
            max_num_seqs=4,
            max_model_len=128,
            device=args.device,
            dtype=args.dtype,
            cuda_graphs=graphs,
            batch_buckets=(1, 2, 4),
            ctx_buckets=(64,),
            max_trailing_tokens=16,
            fast_math=fast,
            compile=compiled,
            kernels=kernels,
        )
        eng = await NativeEngine.create(None, cfg, talker=talker)
        try:

            async def one(i, p, t, mf):
                while eng.steps < 2 * i:
                    await asyncio.sleep(0.001)
                out = []
                async for c in eng.synthesize(
                    TalkerRequest(request_id=f"r{i}", prompt_embeds=p, trailing=t, max_frames=mf, greedy=True)
                ):
                    out.append(c)
                return np.concatenate(out) if out else np.zeros((0, 16), np.int32)

            res = await asyncio.gather(*(one(i, *pt) for i, pt in enumerate(prompts)))
            assert eng.stats()["active"] == 0
            return res, dict(eng.step_hist)
        finally:
            eng.shutdown()

    report = {}
    variants = [("eager", False, None, False, "torch"), ("graphs", True, None, False, "torch")]
    if args.device.startswith("cuda"):
        variants.append(("graphs-exactmath", True, False, False, "torch"))
        if args.compile:  # reported, not required to equal eager (inductor reorders arithmetic)
            variants.append(("graphs-compiled", True, None, True, "torch"))
        if args.kernels == "triton":  # reported: the kernels round once per stored tensor
            variants.append(("graphs-kernels-triton", True, None, False, "triton"))
    outs = {}
    for name, graphs, fast, compiled, kern in variants:
        res, hist = asyncio.run(run(graphs, fast, compiled, kern))
        outs[name] = res
        same_ref = [bool(r.shape == w.shape and np.array_equal(r, w)) for r, w in zip(res, refs)]
        frac = [
            float((r[: min(len(r), len(w))] == w[: min(len(r), len(w))]).all(1).mean()) if len(w) else 1.0
            for r, w in zip(res, refs)
        ]
        report[name] = {
            "identical_to_reference": same_ref,
            "prefix_frame_match": frac,
            "steps": {f"{b}x{c}": n for (b, c), n in hist.items()},
        }
        print(
            f"{name:18s} identical to generate_codes: {same_ref}  frame-match: {[round(f, 2) for f in frac]}",
            flush=True,
        )
    eq = all(np.array_equal(a, b) for a, b in zip(outs["eager"], outs["graphs"]))
    report["graphs_equal_eager"] = eq
    print(f"graphs == eager (greedy frames): {eq}", flush=True)
    if not eq:
        raise SystemExit("CHECK FAILED: graph replay differs from eager execution")
    return {"check": report}


# ------------------------------------------------------------------------------------------------


def make_smoke_checkpoint() -> str:
    from triton_qwen3_tts.tools.random_checkpoint import write_temp_checkpoint

    return write_temp_checkpoint("tiny", prefix="bench-smoke-")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="qwen3-tts-bench-model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--checkpoint", help="checkpoint directory (official layout)")
    ap.add_argument("--engine", choices=("native", "vllm"), default="native")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--frames", type=int, default=200, help="frames per request (EOS suppressed)")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per level")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="engine slots (default: max concurrency)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-trailing", type=int, default=256)
    ap.add_argument("--no-graphs", action="store_true", help="eager (no CUDA graphs)")
    ap.add_argument("--profile-step", action="store_true", help="native+CUDA: per-bucket step breakdown")
    ap.add_argument("--profile-ctx", type=int, default=300, help="context length for --profile-step")
    ap.add_argument("--profile-iters", type=int, default=100)
    ap.add_argument(
        "--profile-top-p",
        type=float,
        default=1.0,
        help="--profile-step: top_p of every row (< 1 times the top-p graph variant)",
    )
    ap.add_argument(
        "--profile-prefill",
        type=int,
        nargs="*",
        default=[],
        help="--profile-step: also time the captured batched prefill at these prompt lengths",
    )
    ap.add_argument(
        "--profile-kernels",
        type=int,
        nargs="*",
        default=[],
        metavar="B",
        help="--profile-step: also list the full step's kernels at these batch buckets (torch.profiler over "
        "--profile-iters replays): kernels per step, their summed time against the step's, the top ones",
    )
    # native engine A/B knobs (NativeEngineConfig)
    ap.add_argument("--compile", action="store_true", help="native: torch.compile the per-layer blocks")
    ap.add_argument("--no-fuse", action="store_true", help="native: separate q/k/v and gate/up GEMMs")
    ap.add_argument("--no-skip-top-p", action="store_true", help="native: always run the top-p filter")
    ap.add_argument("--exact-math", action="store_true", help="native: fast_math=False (reference op order)")
    ap.add_argument("--no-batched-prefill", action="store_true", help="native: prefill one request at a time")
    ap.add_argument("--no-prefill-graphs", action="store_true", help="native: eager prefill")
    ap.add_argument(
        "--no-overlap", action="store_true", help="native: read each step's frames before launching the next"
    )
    ap.add_argument(
        "--kernels",
        choices=KERNELS,
        default="torch",
        help="native: the decode step's layers (talker and code predictor) as torch blocks or fused Triton kernels (CUDA)",
    )
    ap.add_argument(
        "--gemv-rows",
        type=int,
        default=None,
        help="--kernels triton: GEMMs of at most this many rows on the few-row kernel (whole weight rows per "
        "program, no K loop); default: engines/native/kernels.py GEMV_ROWS (2); 0: the tiled kernel always",
    )
    ap.add_argument(
        "--split-k",
        type=int,
        default=None,
        metavar="PROGRAMS_PER_SM",
        help="--kernels triton: the tiled GEMM kernel cuts K into parts until a launch has about this many "
        "programs per multiprocessor (NativeEngineConfig.split_k); default: the engine's (1); 0: never",
    )
    ap.add_argument(
        "--prefill-kernel-rows",
        type=int,
        default=None,
        metavar="ROWS",
        help="--kernels triton: prefills of at most ROWS padded rows run the talker layers' GEMMs on the "
        "kernels (NativeEngineConfig.prefill_kernel_rows); default: the engine's (64; 0: the torch blocks)",
    )
    ap.add_argument(
        "--pdl",
        choices=PDL_MODES,
        default=None,
        help="--kernels triton on Hopper or newer: programmatic dependent launch of the kernels; prefetch: "
        "the GEMMs also prefetch their weights into L2 before waiting for the previous kernel; few: on for "
        "launches of at most GEMV_ROWS rows; default: engines/native/kernels.py PDL (few)",
    )
    ap.add_argument(
        "--decode-attention",
        choices=DECODE_ATTENTION_MODES,
        default="triton",
        help="--kernels triton: the talker's decode attention as the flash-decoding kernel (each row's cached "
        "positions) or PyTorch's SDPA over the context bucket (engines/native/kernels.py DECODE_ATTENTION)",
    )
    ap.add_argument(
        "--cp-parity",
        type=int,
        default=0,
        metavar="FRAMES",
        help="--profile-step: also compare the code predictor's torch and triton codes over FRAMES frames",
    )
    ap.add_argument(
        "--cp-parity-rows",
        type=int,
        default=0,
        metavar="ROWS",
        help="--cp-parity: rows per code-predictor call (default: the engine's slots); 1 compares the one-row "
        "kernels (the few-row GEMM kernel, engines/native/kernels.py GEMV_ROWS)",
    )
    ap.add_argument(
        "--batch-buckets",
        type=int,
        nargs="+",
        default=None,
        help="native: decode/prefill batch buckets (fewer -> faster capture and --compile)",
    )
    ap.add_argument(
        "--prefill-max-tokens",
        type=int,
        default=4096,
        help="native: padded prompt rows per batched prefill (and largest captured bucket)",
    )
    ap.add_argument(
        "--random-preset",
        help="no checkpoint: random weights of this preset (e.g. "
        "1.7b-customvoice), built on the device; random prompt embeddings (native only)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="native: greedy frames of graphs == eager "
        "(== reference generate_codes with --exact) on the device, then exit",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CI: tiny random checkpoint (or --checkpoint) on CPU, fp32, eager, c=1,2, 6 frames",
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    _import_torch()
    if args.smoke:
        torch.set_num_threads(1)
        args.checkpoint = args.checkpoint or make_smoke_checkpoint()
        args.device, args.dtype, args.concurrency, args.frames, args.rounds = "cpu", "float32", [1, 2], 6, 1
        args.no_graphs = True  # vLLM-CPU would torch.compile the backbone first (~1 min on 2 cores)
        args.max_model_len, args.max_trailing = min(args.max_model_len, 256), min(args.max_trailing, 128)
    if not args.checkpoint and not args.random_preset:
        ap.error("--checkpoint or --random-preset is required (or --smoke)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.kernels == "triton":
        from triton_qwen3_tts.engines.native import kernels

        if args.pdl is not None:  # the engine's load sets it again from NativeEngineConfig.pdl
            kernels.set_pdl(args.pdl)
        kernels.set_decode_attention(args.decode_attention)
        if args.gemv_rows is not None:
            kernels.GEMV_ROWS = args.gemv_rows
        if args.split_k is not None:  # the engine's load sets it again from NativeEngineConfig.split_k
            kernels.SPLIT_K_TARGET = args.split_k
    result = {
        "args": {k: v for k, v in vars(args).items()},
        "host": platform.node(),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    if args.check:
        result.update(check(args))
    elif args.profile_step:
        if args.engine != "native":
            raise SystemExit("--profile-step is for --engine native")
        result.update(profile_step(args))
    else:
        result.update(asyncio.run(sweep(args)))
    if args.kernels == "triton":
        result["pdl"] = kernels.PDL  # "off" when the self-test found no PDL in this Triton
        result["gemv_rows"] = kernels.GEMV_ROWS
        result["split_k"] = kernels.SPLIT_K_TARGET
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=float))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
