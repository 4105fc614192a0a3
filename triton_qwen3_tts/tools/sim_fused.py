"""A discrete-event simulation of the fused pipeline's scheduler loop on one GPU.

Why: each change to the deadline policy (``serving/talker/deadline.py``) needs a GPU run of
many minutes to measure, and GPU time is scarce. This runs the policy itself (the same
:class:`DeadlinePolicy` object the server runs) inside a model of the loop around it, on a
clock that advances by measured costs, so a policy change can be screened in seconds on a CPU
before it is measured on a GPU. Its figures are predictions, never goal figures.

The model follows ``engines/native/engine.py`` (``_scheduler``/``_work``) and
``serving/talker/fused.py`` (``FusedPipeline.run``), one loop iteration at a time:

1. waiting requests are admitted (up to ``max_num_seqs`` in flight) and prefilled together:
   ``prefill_ms + prefill_ms_per_row`` x their prompt rows;
2. the policy picks a codec batch (it then costs ``codec_ms[(batch bucket, frames)]``) or None,
   and then a talker step of every active stream costs ``step_ms[batch bucket]`` and gives
   each of them one frame;
3. every iteration costs ``iter_ms`` more (the loop's Python, the host sync, the hand-over).

A request's audio reaches its client ``out_ms`` after its codec call ends, and its engine sees
it ``in_ms`` after it was sent (gRPC, the tts, the worker process), once its prompt is built
(``prompt_ms``: on ``prompt_threads`` threads beside the loop, or, as before commit ``6c964cb``,
on the loop itself, which then stops for it). The client side is the benchmark's
(``tools/bench_metrics.py``): time to first audio, a real-time player's underruns, the capacity
line of ``tools/bench_service.py``.

Costs, by default (``--costs run33``, :data:`H100_RUN33`), are the GPU time of each launch as
run 33 measured it through the server (the engine's ``gpu_ms``: CUDA event pairs around every
decode step, prefill and codec call; H100 80GB HBM3, 1.7B random real-size weights, bf16, 128
slots, the loop overlapped with the GPU: an iteration that runs a codec call launches a decode
step too), plus 0.5 ms of host time an iteration fitted to run 34b's GPU busy share (93-96 % at
50 req/s, 104-109 iterations a second; ``scripts/gpu_busy.py``). With it the model's open loop
of 4-s clips (four seeds) gives TTFA p95 88 / 157 / 203 ms at 50 / 60 / 70 req/s against 62-112
/ 101-301 / 240-330 measured (runs 33-34, 12-s levels and a 2-minute soak), and 95 % busy; its
underruns run higher than measured (1-8 % against 0-4 %). Its
lesson: near capacity the GPU is saturated, and of the changes it can try only a faster decode
step passes 60 req/s (the code predictor's 3.6 ms halved: p95 79 ms); hiding host time, a
1.5-ms prefill or a 1-ms codec floor alone do not (docs/benchmark-history.md, run 34).

``--costs run43`` (:data:`H200_RUN43`) are the H200's: run 43's server figures at 64 streams and
run 39b's codec slots. With them the model's closed loop of 64 streams runs in waves (about 105
prefills a 30-s level against the server's 336-400) and reads about 680 audio-s/s against
560-600 measured; its open loops are what it is for. Its prediction for the engine's admission
hold (``--admit-hold-ms 30``): at 20 req/s of 4-s clips TTFA p95 53 -> 82 ms, at 70 req/s 80 ->
90 ms with underruns 0.8 -> 0.0 %. It underrates the hold's cost at 70 req/s: with a 32-row
minimum (``--admit-hold-min-rows 32``) it predicted 80 -> 88 ms, and the server measured 73 ->
126 ms (run 44b; the server decodes more rows at that rate than the model does). With
``--finish pad_first`` (finished streams' last chunks in one padded call, ranked before the due
streams) it rated 64 streams the same (fewer codec calls, 714 against 777) and 70 req/s at TTFA
p95 65 ms against 80, where the server measured 56 against 68 (run 45b).

The older costs (``--costs run29``, :data:`H100`) are run 29's, H100 80GB HBM3, 1.7B random real-size weights, bf16:
the frame step with the Triton kernels (29b, context 300), the codec's slots with plain CUDA
graphs (29b, every slot measured) and with the compiled step (measured at 32 streams only; other
batch sizes are scaled by the 32-stream ratio for the same frame count), the batched prefill
(run 2: 3.1 ms for one prompt of 32 rows, 16.1 ms for 64 of them), ``iter_ms``/``in_ms``/
``out_ms`` fitted to 29a's one-stream figures (its frame rate and time to first audio), and
``prompt_ms`` 5 ms fitted to the 64-stream waves' time to first audio of 29a and 29c (prompts
built on the loop then).

How well it predicts the server (``--calibrate`` prints the model, run on the code those runs
ran, beside runs 29a and 29c; docs/benchmark-history.md, run 29): the median time to first
audio at 1, 32 and 64 streams within about 10 %, and the p95 at 20 req/s within about 15 ms, with
no underrun, as measured; but 9-19 % more audio-seconds per second at 64 streams than measured,
and far shorter tails from 30 req/s (p95 75-105 against 227-385 ms): host work it does not model
(each stream's Python per step, the audio's way to the tts) costs the server more as the load
grows. Read its figures as upper bounds and as a ranking of policies, not as the server's.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from triton_qwen3_tts.engines.native.admission import hold_admission
from triton_qwen3_tts.serving.codec.batch import bucket
from triton_qwen3_tts.serving.settings import default
from triton_qwen3_tts.serving.talker.deadline import FINISH, FRAME_SECONDS, RIDE_ALONG, DeadlinePolicy, StreamState
from triton_qwen3_tts.serving.talker.fused import deadline_policy
from triton_qwen3_tts.tools.bench_metrics import RequestRecord, aggregate

SAMPLES_PER_FRAME = 1920

# run 29b, plain CUDA graphs: ms per call, batch bucket -> ms for frames 1, 2, 4, 8, 16, 25
_PLAIN = {
    1: (2.719, 2.917, 3.018, 3.231, 3.739, 4.964),
    2: (2.823, 3.076, 3.302, 3.844, 6.308, 7.074),
    4: (2.922, 3.341, 3.861, 6.324, 8.335, 10.868),
    8: (3.191, 3.913, 6.387, 8.392, 12.592, 20.845),
    16: (3.767, 6.510, 8.502, 12.718, 23.414, 31.584),
    32: (6.024, 9.557, 13.053, 21.606, 40.139, 60.919),
}
_COMPILED_32 = (2.575, 4.286, 6.814, 11.559, 20.991, 32.022)  # run 29b, 32 streams, compiled step
_FRAMES = (1, 2, 4, 8, 16, 25)


def _codec_table(compiled: bool) -> Dict[Tuple[int, int], float]:
    out = {}
    for b, row in _PLAIN.items():
        for i, t in enumerate(_FRAMES):
            ms = row[i]
            if compiled and t > 1:  # one frame runs uncompiled (serving/codec/graphs.py)
                ms *= _COMPILED_32[i] / _PLAIN[32][i]
            out[b, t] = ms
    return out


@dataclass
class Costs:
    step_ms: Dict[int, float]  # talker step (with the code predictor and sampling) per batch bucket
    codec_ms: Dict[Tuple[int, int], float]  # (batch bucket, frames) -> ms
    prefill_ms: float = 2.9
    prefill_ms_per_row: float = 0.0064
    iter_ms: float = 0.6
    in_ms: float = 7.0
    out_ms: float = 7.0
    # building a request's prompt (tokenizing, projecting its text rows on the CPU), and whether
    # it blocks the loop (built on the event loop, before commit 6c964cb) or runs on
    # ``prompt_threads`` threads beside it
    prompt_ms: float = 0.0
    prompt_blocking: bool = False
    prompt_threads: int = 2
    # the overlapped loop (``native_overlap``, run 32 on): an iteration that runs a codec call
    # also launches a decode step behind it; without it, a codec call takes the step's place
    overlap: bool = False

    def step(self, rows: int) -> float:
        return self.step_ms[_bucket(sorted(self.step_ms), rows)]

    def codec(self, rows: int, frames: int) -> float:
        buckets = sorted({b for b, _ in self.codec_ms})
        b = _bucket(buckets, rows)
        if (b, frames) in self.codec_ms:
            return self.codec_ms[b, frames]
        # a frame count without its own entry: linear between the neighbours
        ts = sorted(t for bb, t in self.codec_ms if bb == b)
        lo = max((t for t in ts if t <= frames), default=ts[0])
        hi = min((t for t in ts if t >= frames), default=ts[-1])
        if lo == hi:
            return self.codec_ms[b, lo] * frames / lo
        w = (frames - lo) / (hi - lo)
        return self.codec_ms[b, lo] * (1 - w) + self.codec_ms[b, hi] * w


def _bucket(sizes: Sequence[int], n: int) -> int:
    """The smallest bucket >= n; the largest for more rows than any (its cost stands in for them)."""
    return min(bucket(n, sizes), sizes[-1])


H100 = Costs(step_ms={1: 6.30, 8: 6.56, 32: 6.92, 64: 8.06}, codec_ms=_codec_table(False), prompt_ms=5.0)
H100_CODEC_COMPILED = replace(H100, codec_ms=_codec_table(True))


def _codec_table_run33() -> Dict[Tuple[int, int], float]:
    """The compiled codec's calls as run 33 timed them on the GPU (the engine's ``gpu_ms``): no
    call below 2.1 ms (1 stream x 2 frames: 2.13 ms mean over 433 first chunks in 33b and over
    3,084 in the soak 33d, where the 32-stream compile ratio gives 1.3), the compiled table
    (run 29b) above that. Its mean per call in the simulated open loops, 3.5-3.9 ms at 50-60
    req/s, is the measured one (3.4-4.0 ms in 33b-33d)."""
    return {k: max(v, CODEC_FLOOR_MS) for k, v in _codec_table(True).items()}


CODEC_FLOOR_MS = 2.1

# run 33 (H100, the engine's gpu_ms: CUDA event pairs around each launch): decode steps 31d /
# 33b-33d (5.37 / 5.63 / 5.28-5.39 / 6.57 ms at 1 / 8 / 32 / 64 rows; 128 rows not timed, 8.0
# assumed), the one-prompt prefill 3.67-3.71 ms (its rows' share kept from run 2), the compiled
# codec's calls (_codec_table_run33); the prompt built beside the loop (1.5 ms, run 30's GPU
# projection with tokenizing); the overlapped loop (a decode step in every iteration). Fitted,
# not measured: the loop's host time the overlap does not hide, 0.5 ms an iteration (run 34b's
# server: the GPU busy 93-96 % of the time at 50 req/s, 104-109 iterations a second, 8.8-8.9 ms
# of device time in 9.1-9.6 ms each; the model then gives 95 % and 103), and the audio's way in
# and out (its median)
H100_RUN33 = Costs(
    step_ms={1: 5.37, 8: 5.63, 32: 5.33, 64: 6.57, 128: 8.0},
    codec_ms=_codec_table_run33(),
    prefill_ms=3.7 - 0.0064 * 30,
    iter_ms=0.5,
    in_ms=12.0,
    out_ms=8.0,
    prompt_ms=1.5,
    overlap=True,
)


# run 43 (H200, the engine's gpu_ms in the server at 64 streams, 43a): decode steps 2.99 / 5.33 /
# 4.83 / 5.10 ms at 1 / 8 / 32 / 64 rows (128 rows not timed in the server: 7.0 assumed), a
# prefill 4.7 ms for about 3.4 prompts of 30 rows (its rows' share kept from run 2), the
# compiled channels-last codec's slots as run 39b timed them alone (codec_slots.py) plus 0.6 ms a
# call (43a's first-chunk calls: 2.04 ms against the 1.44-1.49 of their slots), 0.35 ms of gaps
# an iteration (43a: 0.35-0.38), the audio's way in and out as run 33's table
_RUN39B_SLOTS = {
    2: (2.715, 1.435, 1.463, 1.62, 1.983, 2.435),
    4: (2.817, 1.485, 1.634, 1.99, 2.697, 3.596),
    8: (3.061, 1.7, 2.068, 2.741, 4.154, 5.838),
    16: (3.578, 2.144, 2.846, 4.283, 7.114, 10.115),
    32: (4.114, 3.014, 4.492, 7.224, 12.501, 18.903),
}
H200_RUN43 = Costs(
    step_ms={1: 2.99, 8: 5.33, 32: 4.83, 64: 5.10, 128: 7.0},
    codec_ms={(b, t): ms + 0.6 for b, row in _RUN39B_SLOTS.items() for t, ms in zip(_FRAMES, row)},
    prefill_ms=4.7 - 0.0064 * 100,
    iter_ms=0.35,
    in_ms=12.0,
    out_ms=8.0,
    prompt_ms=1.5,
    overlap=True,
)


@dataclass
class _Req:
    rid: int
    t_send: float
    frames: int
    prompt_rows: int
    state: StreamState
    generated: int = 0
    chunks: List[Tuple[float, int]] = field(default_factory=list)  # (client arrival, samples)
    t_end: Optional[float] = None
    t_wait: float = 0.0  # when it reached the engine's queue (the admission hold counts from here)


@dataclass
class Load:
    """Closed loop (``streams`` clients, each sending again when its request ends) or open loop
    (Poisson arrivals at ``rate`` req/s) for ``duration`` seconds after ``warmup``."""

    frames: int
    streams: int = 0
    rate: float = 0.0
    duration: float = 12.0
    warmup: float = 1.0
    prompt_rows: int = 64
    seed: int = 0


def simulate(
    policy: DeadlinePolicy,
    costs: Costs,
    load: Load,
    max_num_seqs: int = 64,
    admit_hold_ms: float = 0.0,
    admit_hold_requests: int = 8,
    admit_hold_min_rows: int = 1,
) -> dict:
    """Run ``load`` through the modelled loop; returns :func:`aggregate`'s level summary (of
    the requests sent after the warm-up) plus the codec calls' statistics. ``admit_hold_ms`` /
    ``admit_hold_requests`` / ``admit_hold_min_rows``: the engine's admission hold (``engines/native/admission.py``, the
    same rule)."""
    policy = replace(policy)  # its alternation state is per run
    rng = random.Random(load.seed)
    now = 0.0
    arrivals: List[Tuple[float, int]] = []  # heap of (engine arrival time, rid)
    reqs: Dict[int, _Req] = {}
    next_id = [0]
    end_time = load.warmup + load.duration

    def send(t: float) -> None:
        rid = next_id[0]
        next_id[0] += 1
        reqs[rid] = _Req(rid, t, load.frames, load.prompt_rows, StreamState(rid, t + costs.in_ms / 1000))
        heapq.heappush(arrivals, (t + costs.in_ms / 1000, rid))

    if load.streams:
        for _ in range(load.streams):
            send(0.0)
    else:
        t = 0.0
        while t < end_time:
            send(t)
            t += rng.expovariate(load.rate)
    waiting: deque = deque()
    threads_free = [0.0] * max(1, costs.prompt_threads)  # when each prompt thread is free
    active: List[_Req] = []
    live: Dict[int, _Req] = {}  # admitted, audio not all out
    calls = rows_total = prefills = 0
    codec_s = step_s = prefill_s = 0.0
    iterations = 0
    while True:
        while arrivals and arrivals[0][0] <= now:
            t_arr, rid = heapq.heappop(arrivals)
            r = reqs[rid]
            if costs.prompt_ms and not getattr(r, "built", False):
                r.built = True
                if costs.prompt_blocking:  # on the loop: everything waits for it
                    now += costs.prompt_ms / 1000
                else:  # on a free prompt thread; the request waits until it is built
                    k = min(range(len(threads_free)), key=threads_free.__getitem__)
                    threads_free[k] = max(threads_free[k], t_arr) + costs.prompt_ms / 1000
                    heapq.heappush(arrivals, (threads_free[k], rid))
                    continue
            r.t_wait = now
            waiting.append(r)
        if not waiting and not active and not any(r.state.pending for r in live.values()):
            if not arrivals:
                break
            now = arrivals[0][0]
            continue
        admits = []
        held = bool(waiting) and hold_admission(
            admit_hold_ms,
            admit_hold_requests,
            waiting=len(waiting),
            free=max_num_seqs - len(live),
            active=len(active),
            waited_ms=(now - waiting[0].t_wait) * 1000,
            min_rows=admit_hold_min_rows,
        )
        while not held and waiting and len(live) + len(admits) < max_num_seqs:
            admits.append(waiting.popleft())
        if admits:
            prefills += 1
            cost = (costs.prefill_ms + costs.prefill_ms_per_row * sum(r.prompt_rows for r in admits)) / 1000
            now += cost
            prefill_s += cost
            for r in admits:
                active.append(r)
                live[r.rid] = r
        states = [r.state for r in live.values()]
        first = policy.first_chunk_frames
        urgent = any(s.chunks == 0 and not s.talker_done and s.pending < first for s in states)
        batch = policy.pick(states, now, bool(active), urgent)
        if batch is not None:
            cost = costs.codec(len(batch.sids), batch.frames) / 1000
            now += cost
            codec_s += cost
            calls += 1
            rows_total += len(batch.sids)
            for sid in batch.sids:
                r = live[sid]
                s = r.state
                n = min(s.pending, batch.frames)  # fewer: a finished stream's padded rest (finish pad)
                s.pending -= n
                if s.t_first is None:
                    s.t_first = now
                s.delivered += n
                s.chunks += 1
                r.chunks.append((now + costs.out_ms / 1000 - r.t_send, n * SAMPLES_PER_FRAME))
                if s.finished:
                    r.t_end = now + costs.out_ms / 1000
                    del live[sid]
                    if load.streams and r.t_end < end_time:
                        send(r.t_end)
        if active and (batch is None or costs.overlap):
            cost = costs.step(len(active)) / 1000
            now += cost
            step_s += cost
            for r in list(active):
                r.generated += 1
                r.state.pending += 1
                if r.generated >= r.frames:
                    r.state.talker_done = True
                    active.remove(r)
        now += costs.iter_ms / 1000
        iterations += 1
    done = [r for r in reqs.values() if load.warmup <= r.t_send < end_time and r.t_end is not None]
    recs = [
        RequestRecord(
            t_send=r.t_send, ok=True, latency=r.t_end - r.t_send, chunks=r.chunks, level=load.streams or load.rate
        )
        for r in done
    ]
    if load.streams:  # closed loop: the audio of the requests that ended within the level
        in_level = [r for r in reqs.values() if r.t_end is not None and load.warmup <= r.t_end < end_time]
        wall = load.duration
        audio = sum(r.frames for r in in_level) * FRAME_SECONDS
    else:
        wall = max(r.t_end for r in done) - load.warmup if done else load.duration
        audio = sum(r.frames for r in done) * FRAME_SECONDS
    agg = aggregate(recs, wall=wall, level=load.streams or load.rate, mode="closed" if load.streams else "open")
    agg["audio_s_per_s"] = audio / wall
    agg["codec_calls"] = calls
    agg["prefills"] = prefills
    agg["codec_rows_per_call"] = rows_total / calls if calls else 0.0
    agg["gpu_busy_codec_s"] = codec_s
    agg["gpu_busy_step_s"] = step_s
    agg["gpu_busy_prefill_s"] = prefill_s
    # the share of the run the modelled GPU computes (scripts/gpu_busy.py measures it on a server)
    agg["gpu_busy_pct"] = 100 * (codec_s + step_s + prefill_s) / now if now else 0.0
    agg["iterations"] = iterations
    agg["sim_seconds"] = now
    return agg


def _policy(args) -> DeadlinePolicy:
    ramp = tuple(int(x) for x in args.chunk_ramp.split(",") if x)
    return deadline_policy(
        args.first_chunk_frames,
        ramp,
        args.chunk_frames,
        args.buffer_ms,
        args.codec_max_batch,
        args.ride_along,
        args.finish,
        args.ahead_batch,
    )


def _row(name: str, agg: dict) -> str:
    from triton_qwen3_tts.tools.bench_service import underrun_pct

    t = agg["ttfa"]
    ms = lambda v: f"{v * 1000:6.0f}" if v is not None else "     -"  # noqa: E731
    return (
        f"{name:<28} {agg['level']:>6} {agg['audio_s_per_s']:8.1f} {ms(t['p50'])} {ms(t['p95'])} {ms(t['p99'])} "
        f"{underrun_pct(agg) or 0.0:7.1f}% {agg['codec_calls']:6d} {agg['codec_rows_per_call']:6.1f} "
        f"{agg['gpu_busy_pct']:5.0f}% {agg['prefills']:8d}"
    )


def summary(levels: Sequence[dict]) -> str:
    """One line over the seeds of one open-loop rate: TTFA p95's mean (range) and the mean
    underrun share, the figures a screen compares against the capacity line (p95 <= 100 ms,
    underruns < 1 %)."""
    from triton_qwen3_tts.tools.bench_service import underrun_pct

    p95 = [a["ttfa"]["p95"] * 1000 for a in levels if a["ttfa"]["p95"] is not None]
    under = [underrun_pct(a) or 0.0 for a in levels]
    rng = f"{min(p95):.0f}-{max(p95):.0f}" if p95 else "-"
    mean = f"{sum(p95) / len(p95):.0f}" if p95 else "-"
    return (
        f"  {levels[0]['level']:g} req/s, {len(levels)} seeds: TTFA p95 mean {mean} ms ({rng}), "
        f"underrun mean {sum(under) / len(under):.1f} %"
    )


HEADER = (
    f"{'case':<28} {'level':>6} {'audio/s':>8} {'p50':>6} {'p95':>6} {'p99':>6} {'underrun':>8} {'calls':>6} "
    f"{'rows':>6} {'busy':>6} {'prefills':>8}"
)

# runs 29a (codec plain graphs) and 29c (codec compiled), H100, through the server: what
# --calibrate prints beside the model's figures (audio-s/s, TTFA p50 / p95 ms, underrun %)
MEASURED = {
    ("plain", "closed", 1): "11.46, 32 / 40, 0.0 % (29a)",
    ("plain", "closed", 64): "286.9, 360 / 424, 2.3 % (29a)",
    ("plain", "open", 20): "72.4, 50 / 69, 0.0 % (29a)",
    ("plain", "open", 30): "112.7, 69 / 385, 1.4 % (29a)",
    ("compiled", "closed", 1): "11.46, 33 / 38, 0.0 % (29c)",
    ("compiled", "closed", 32): "224.4, 217 / 251, 0.5 % (29c)",
    ("compiled", "closed", 64): "313.3, 394 / 570, 2.7 % (29c)",
    ("compiled", "open", 20): "72.6, 53 / 80, 0.0 % (29c)",
    ("compiled", "open", 30): "114.1, 63 / 227, 0.8 % (29c)",
    ("compiled", "open", 40): "145.0, 158 / 513, 0.0 % (29c)",
    # runs 33a (main c9ecabd, 128 slots) and 34, what the run33 table is compared with; printed beside it
    ("run33", "open", 50): "188.7, 44 / 62, 0.2 % (33a; 34d: 47 / 70, 0.0 %; 2-min soak 34b: 46 / 112, 0.4 %)",
    ("run33", "open", 60): "232.3, 51 / 101, 2.4 % (33a; 34a: 49 / 227, 0.0 %; 34d: 55 / 205, 0.0 %)",
    ("run33", "open", 70): "267.4, 60 / 245, 1.0 % (33a; 33c: 69 / 330, 5.3 %; 34d: 64 / 318, 0.2 %)",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--costs",
        choices=("run33", "run43", "run29"),
        default="run33",
        help="cost table: run33 = the GPU time per launch run 33 measured (H100, overlapped loop, compiled "
        "codec; --codec is ignored); run43 = run 43's (H200, H200_RUN43); run29 = run 29's (--codec picks its "
        "codec table)",
    )
    ap.add_argument("--codec", choices=("plain", "compiled"), default="compiled", help="codec cost table (run 29b)")
    ap.add_argument("--max-num-seqs", type=int, default=128, help="talker slots (run 33: 128)")
    ap.add_argument(
        "--prompt-rows", type=int, default=30, help="prompt rows per request (the benchmark's texts: 27-31)"
    )
    ap.add_argument("--streams", type=int, nargs="*", default=[1, 32, 64], help="closed-loop levels")
    ap.add_argument("--rates", type=float, nargs="*", default=[20, 30, 40], help="open-loop levels (req/s)")
    ap.add_argument("--frames", type=int, default=200, help="closed loop: frames per request")
    ap.add_argument("--open-frames", type=int, default=50, help="open loop: frames per request (4-s clips)")
    ap.add_argument("--duration", type=float, default=12.0)
    ap.add_argument("--first-chunk-frames", type=int, default=2)
    ap.add_argument("--chunk-ramp", default="2,4,8,16")
    ap.add_argument("--chunk-frames", type=int, default=25)
    ap.add_argument("--codec-max-batch", type=int, default=32)
    ap.add_argument("--buffer-ms", type=float, default=400)
    ap.add_argument(
        "--ride-along", choices=RIDE_ALONG, default=default("fused_ride_along"), help="the fused_ride_along setting"
    )
    ap.add_argument("--finish", choices=FINISH, default=default("fused_finish"), help="the fused_finish setting")
    ap.add_argument(
        "--ahead-batch", type=int, default=default("fused_ahead_batch"), help="the fused_ahead_batch setting"
    )
    ap.add_argument("--seeds", type=int, default=3, help="open loop: arrival seeds averaged")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="model the code of runs 29a/29c (prompts built on the loop, fused_ride_along schedule) and print "
        "their measured figures beside",
    )
    ap.add_argument("--prompt-ms", type=float, default=None, help="prompt build time (default: the cost table's)")
    ap.add_argument(
        "--admit-hold-ms",
        type=float,
        default=default("native_admit_hold_ms"),
        help="the engine's admission hold (the native_admit_hold_ms setting)",
    )
    ap.add_argument(
        "--admit-hold-requests",
        type=int,
        default=default("native_admit_hold_requests"),
        help="the native_admit_hold_requests setting",
    )
    ap.add_argument(
        "--admit-hold-min-rows",
        type=int,
        default=default("native_admit_hold_min_rows"),
        help="the native_admit_hold_min_rows setting",
    )
    ap.add_argument("--json", help="write the levels here")
    args = ap.parse_args(argv)
    costs = H100_CODEC_COMPILED if args.codec == "compiled" else H100
    if args.costs == "run33" and not args.calibrate:
        costs = H100_RUN33
    elif args.costs == "run43" and not args.calibrate:
        costs = H200_RUN43
    if args.calibrate:  # the code of runs 29a/29c: prompts on the loop, ride-alongs by schedule, 64 slots
        costs = replace(costs, prompt_blocking=True)
        args.ride_along = "schedule"
        args.max_num_seqs, args.prompt_rows = 64, 64
    if args.prompt_ms is not None:
        costs = replace(costs, prompt_ms=args.prompt_ms)
    policy = _policy(args)
    # the case label and MEASURED's key
    table = "run33" if costs is H100_RUN33 else "run43" if costs is H200_RUN43 else args.codec
    shown = args.calibrate or table == "run33"
    hold = dict(
        admit_hold_ms=args.admit_hold_ms,
        admit_hold_requests=args.admit_hold_requests,
        admit_hold_min_rows=args.admit_hold_min_rows,
    )
    print("simulated (not measured):", HEADER, sep="\n")
    out = []
    for c in args.streams:
        agg = simulate(
            policy,
            costs,
            Load(frames=args.frames, streams=c, duration=args.duration, prompt_rows=args.prompt_rows),
            max_num_seqs=args.max_num_seqs,
            **hold,
        )
        out.append(agg)
        line = _row(f"closed {table}", agg)
        m = MEASURED.get((table, "closed", c)) if shown else None
        print(line + (f"   measured: {m}" if m else ""))
    for rate in args.rates:
        level = []
        for seed in range(args.seeds):
            load = Load(
                frames=args.open_frames, rate=rate, duration=args.duration, seed=seed, prompt_rows=args.prompt_rows
            )
            agg = simulate(policy, costs, load, max_num_seqs=args.max_num_seqs, **hold)
            level.append(agg)
            line = _row(f"open {table} seed {seed}", agg)
            m = MEASURED.get((table, "open", int(rate))) if shown and seed == 0 else None
            print(line + (f"   measured: {m}" if m else ""))
        out += level
        if len(level) > 1:
            print(summary(level))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
