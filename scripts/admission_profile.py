#!/usr/bin/env python
"""Host time of one admission of the native engine, with a decode step of the running rows on
the GPU: whether the admission's host work outruns the step queued before it (the GPU's gaps
before prefills at 64 streams, docs/benchmarks.md), and which part of it does.

    python scripts/admission_profile.py --checkpoint CKPT [--device cuda] [--prompts 1 4 8]
    python scripts/admission_profile.py --preset tiny --device cpu   # the flow only (tests)

The engine is built as in the server (CUDA graphs, prefill graphs, pinned copies; not compiled,
which changes the GPU's time, not the host's), then driven by hand instead of by its loop, which
never runs: ``--rows`` running requests are admitted once;
then, ``--repeat`` times for each prompt count, one decode step of them is launched and ``P``
new requests are admitted behind it (``NativeEngine._admit_many``, the loop's own code, its
parts timed by the engine's ``LoopClock``: ``admit_rows``, ``admit_prompts``, ``admit_prefill``),
the GPU is waited for and the new requests are released. Cases: the prompts as the engine gets
them (float32, pageable), the prompts already in the model's dtype in pinned memory (what a
prompt thread could hand over), and either with a Python thread busy beside (the GIL shared
as with the server's event loop and prompt threads, at the loop thread's switch interval).
Prints one line per case and prompt count: host ms per admission (median, p90) and its parts,
and the step's GPU ms it runs behind (median); ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("admit_rows", "admit_prompts", "admit_prefill")


def _busy(stop: threading.Event) -> None:
    """Pure-Python work until ``stop``: holds the GIL as an interpreter thread does."""
    x = 0
    while not stop.is_set():
        for i in range(2000):
            x += i * i


def _requests(eng, n, first_id, rows, trailing, pinned, torch):
    """``n`` engine requests (the engine's own ``_Req``) of ``rows`` prompt rows and ``trailing``
    trailing rows, built as ``synthesize`` builds them (not queued)."""
    from triton_qwen3_tts.engines.base import TalkerRequest
    from triton_qwen3_tts.engines.native.engine import _Req, hash_seed

    out = []
    D = eng.model.D
    for i in range(n):
        g = torch.Generator().manual_seed(first_id + i)
        req = TalkerRequest(
            request_id=f"p{first_id + i}",
            prompt_embeds=torch.randn(rows, D, generator=g) * 0.05,
            trailing=torch.randn(trailing, D, generator=g) * 0.05,
            max_frames=64,
            greedy=True,
            min_new_tokens=1,
        )
        pe, tr = eng.check_request(req)
        if pinned:  # in the model's dtype, pinned: what a prompt thread could hand over
            pe, tr = pe.to(eng.model.dtype), tr.to(eng.model.dtype)
            if eng.model.pos.is_cuda:
                pe, tr = pe.pin_memory(), tr.pin_memory()
        out.append(_Req(req=req, prompt=pe, trailing=tr, key=hash_seed(first_id + i), queue=None))
    return out


def profile(eng, prompts, repeat, rows, trailing, pinned, busy, torch) -> list:
    """One case: per prompt count, the admissions' host ms (and parts) and the steps' GPU ms."""
    cuda = eng.model.pos.is_cuda
    clock = eng.loop_time
    stop = threading.Event()
    th = threading.Thread(target=_busy, args=(stop,), daemon=True) if busy else None
    if th is not None:
        th.start()
    res = []
    next_id = 10_000 * (1 + 2 * pinned + busy)
    try:
        for P in prompts:
            host, parts, gpu = [], {k: [] for k in PARTS}, []
            for _ in range(repeat):
                new = _requests(eng, P, next_id, rows, trailing, pinned, torch)
                next_id += P
                with torch.inference_mode():
                    if cuda:
                        ev0 = torch.cuda.Event(enable_timing=True)
                        ev1 = torch.cuda.Event(enable_timing=True)
                        ev0.record()
                    eng._launch_step()
                    if cuda:
                        ev1.record()
                    before = {k: clock.ms.get(k, 0.0) for k in PARTS}
                    clock.lap("profile")  # the parts below are timed from here
                    t0 = time.perf_counter()
                    eng._admit_many(new)
                    host.append((time.perf_counter() - t0) * 1000.0)
                    for k in PARTS:
                        parts[k].append(clock.ms.get(k, 0.0) - before[k])
                    if cuda:
                        torch.cuda.synchronize()
                        gpu.append(ev0.elapsed_time(ev1))
                    eng._inflight.clear()
                    for r in reversed(new):
                        eng._release(r)
            q = sorted(host)
            res.append(
                {
                    "pinned_prompts": pinned,
                    "busy_thread": busy,
                    "prompts": P,
                    "host_ms_p50": statistics.median(host),
                    "host_ms_p90": q[min(len(q) - 1, int(0.9 * len(q)))],
                    **{f"{k}_ms_p50": statistics.median(v) for k, v in parts.items()},
                    "step_gpu_ms_p50": statistics.median(gpu) if gpu else None,
                    "running_rows": rows,
                }
            )
    finally:
        stop.set()
        if th is not None:
            th.join()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint in the official layout")
    src.add_argument(
        "--preset", help="write a random checkpoint of this preset first (scripts/make_random_checkpoint.py)"
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, nargs="+", default=[1, 4, 8], help="prompts per admission")
    ap.add_argument("--rows", type=int, default=56, help="running requests the step decodes")
    ap.add_argument("--prompt-rows", type=int, default=48, help="rows of each new prompt")
    ap.add_argument("--trailing-rows", type=int, default=24, help="trailing text rows of each new request")
    ap.add_argument("--repeat", type=int, default=30, help="admissions per case and prompt count")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)

    import asyncio

    import torch

    from triton_qwen3_tts.engines.native.config import NativeEngineConfig
    from triton_qwen3_tts.engines.native.engine import SWITCH_INTERVAL_S, NativeEngine

    ckpt = a.checkpoint
    if ckpt is None:
        import subprocess
        import tempfile

        ckpt = tempfile.mkdtemp(prefix="admission-profile-")
        script = Path(__file__).resolve().parent / "make_random_checkpoint.py"
        subprocess.run([sys.executable, str(script), "--preset", a.preset, "--out", ckpt], check=True)
    slots = a.rows + max(a.prompts)
    steps = 3 + 4 * len(a.prompts) * a.repeat  # each admission runs behind one step of the running rows
    ctx = 256
    while ctx < a.prompt_rows + steps + 2:
        ctx *= 2
    # loop_thread off: the scheduler is an asyncio task, which never runs here (the event loop
    # only runs to create the engine), so nothing but this script touches the engine
    cfg = NativeEngineConfig(
        max_num_seqs=slots,
        max_model_len=ctx,
        device=a.device,
        dtype=a.dtype if a.device != "cpu" else "float32",
        batch_buckets=(1, 8, 64, 128) if slots > 64 else (1, 8, 64),
        ctx_buckets=(ctx,),
        max_trailing_tokens=max(64, a.trailing_rows),
        loop_thread=False,
    )
    loop = asyncio.new_event_loop()
    t0 = time.perf_counter()
    eng = loop.run_until_complete(NativeEngine.create(ckpt, cfg))
    print(f"engine ready in {time.perf_counter() - t0:.1f} s ({a.device}, {cfg.dtype}, {slots} slots)", flush=True)
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as the engine's loop thread sets it in the server
    out = []
    try:
        with torch.inference_mode():
            eng._admit_many(_requests(eng, a.rows, 0, a.prompt_rows, a.trailing_rows, False, torch))
        profile(eng, a.prompts[:1], 3, a.prompt_rows, a.trailing_rows, False, False, torch)  # warm-up
        print(
            f"{'prompts':>7} {'pinned':>6} {'busy':>4} {'host p50':>8} {'p90':>6} "
            f"{'rows':>6} {'prompts':>7} {'prefill':>7} {'step gpu':>8}  (ms; an admission behind a step of "
            f"{a.rows} rows)"
        )
        for pinned in (False, True):
            for busy in (False, True):
                for r in profile(eng, a.prompts, a.repeat, a.prompt_rows, a.trailing_rows, pinned, busy, torch):
                    out.append(r)
                    g = r["step_gpu_ms_p50"]
                    print(
                        f"{r['prompts']:>7} {str(pinned):>6} {str(busy):>4} {r['host_ms_p50']:8.2f} "
                        f"{r['host_ms_p90']:6.2f} {r['admit_rows_ms_p50']:6.2f} {r['admit_prompts_ms_p50']:7.2f} "
                        f"{r['admit_prefill_ms_p50']:7.2f} {('%8.2f' % g) if g is not None else '       -'}",
                        flush=True,
                    )
    finally:
        eng._closed = True
        eng._task.cancel()  # the scheduler task never ran
        loop.run_until_complete(asyncio.gather(eng._task, return_exceptions=True))
        loop.close()
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
