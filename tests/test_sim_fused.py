"""The fused pipeline's simulator (triton_qwen3_tts/tools/sim_fused.py): the real deadline
policy on a modelled clock. Its arithmetic on hand-made costs, and the effect it was built to
show (prompts built on the event loop stall the engine)."""

from dataclasses import replace

import pytest

from triton_qwen3_tts.serving.talker.deadline import DeadlinePolicy
from triton_qwen3_tts.serving.talker.fused import frame_buckets
from triton_qwen3_tts.tools import sim_fused as sf


def _policy(**kw):
    base = dict(first_chunk_frames=2, ramp=(2, 4), chunk_frames=8, buffer_s=0.4, urgent_s=0.15, max_batch=8)
    base.update(kw)
    base["frame_buckets"] = frame_buckets(base["first_chunk_frames"], base["ramp"], base["chunk_frames"])
    return DeadlinePolicy(**base)


FLAT = sf.Costs(
    step_ms={1: 10.0, 8: 10.0},
    codec_ms={(b, t): 2.0 for b in (1, 2, 4, 8) for t in (1, 2, 4, 8)},
    prefill_ms=3.0,
    prefill_ms_per_row=0.0,
    iter_ms=0.0,
    in_ms=1.0,
    out_ms=1.0,
)


def test_one_stream_time_to_first_audio_is_the_sum_of_its_parts():
    """in 1 + prefill 3 + two steps of 10 (a 2-frame first chunk) + one codec call 2 + out 1."""
    agg = sf.simulate(_policy(), FLAT, sf.Load(frames=20, streams=1, duration=2.0, warmup=0.0))
    assert agg["ttfa"]["p50"] == pytest.approx(0.027)
    assert agg["requests_with_underrun"] == 0


def test_prompts_built_on_the_loop_stall_a_burst():
    """Eight requests at once, 5 ms of prompt each: on the loop the last one's first audio waits
    for all eight builds; on two threads beside the loop, for four."""
    load = sf.Load(frames=20, streams=8, duration=1.0, warmup=0.0)
    on_loop = sf.simulate(_policy(), replace(FLAT, prompt_ms=5.0, prompt_blocking=True), load)
    threads = sf.simulate(_policy(), replace(FLAT, prompt_ms=5.0, prompt_threads=2), load)
    none = sf.simulate(_policy(), FLAT, load)
    assert none["ttfa"]["p99"] < threads["ttfa"]["p99"] < on_loop["ttfa"]["p99"]
    assert on_loop["ttfa"]["p50"] - none["ttfa"]["p50"] == pytest.approx(0.040, abs=0.011)


def test_closed_loop_throughput_is_bounded_by_the_step():
    """Eight streams of 40 frames, 10-ms steps of every row: at most 8 frames per 10 ms, 64
    audio-seconds per second, less the codec calls', prefills' and gaps' share."""
    agg = sf.simulate(_policy(), FLAT, sf.Load(frames=40, streams=8, duration=5.0, warmup=0.5))
    assert 40 < agg["audio_s_per_s"] <= 64
    assert agg["codec_rows_per_call"] > 1  # the policy batches the streams' chunks


def test_the_overlapped_loop_steps_beside_each_codec_call():
    """With ``overlap`` an iteration that runs a codec call launches a decode step too (the
    engine's ``native_overlap``): one stream of 20 frames then takes its 20 steps in fewer
    iterations, so with host time an iteration it ends sooner than when each codec call takes a
    step's place (the GPU work itself is serial either way); the busy share counts every step,
    codec call and prefill."""
    load = sf.Load(frames=20, streams=1, duration=0.5, warmup=0.0)
    costs = replace(FLAT, iter_ms=1.0)
    apart = sf.simulate(_policy(), costs, load)
    overlapped = sf.simulate(_policy(), replace(costs, overlap=True), load)
    assert overlapped["iterations"] < apart["iterations"]
    assert overlapped["latency"]["p50"] < apart["latency"]["p50"]
    for agg in (apart, overlapped):
        busy = agg["gpu_busy_codec_s"] + agg["gpu_busy_step_s"] + agg["gpu_busy_prefill_s"]
        assert agg["gpu_busy_pct"] == pytest.approx(100 * busy / agg["sim_seconds"])
        assert 70 < agg["gpu_busy_pct"] < 100  # idle for the host time and the requests' hops


def test_the_calibration_command_runs(capsys):
    assert sf.main(["--calibrate", "--streams", "1", "--rates", "10", "--seeds", "1", "--duration", "2"]) == 0
    out = capsys.readouterr().out
    assert "simulated (not measured)" in out and "measured: 11.46" in out


def test_run33_costs_are_the_default(capsys):
    """The default cost table is run 33's GPU timing, printed beside run 33a's measurement."""
    assert sf.main(["--streams", "--rates", "60", "--seeds", "1", "--duration", "2"]) == 0
    out = capsys.readouterr().out
    assert "open run33 seed 0" in out and "measured: 232.3" in out
    # a small codec call costs its measured floor, not the 32-stream compile ratio's share; a
    # full one its compiled time
    assert sf.H100_RUN33.codec(1, 2) == sf.CODEC_FLOOR_MS > sf._codec_table(True)[1, 2]
    assert sf.H100_RUN33.codec(32, 25) == pytest.approx(sf._codec_table(True)[32, 25])


def test_several_seeds_print_a_summary_of_each_rate(capsys):
    assert sf.main(["--streams", "--rates", "5", "--seeds", "2", "--duration", "2"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "seeds:" in ln]
    assert len(lines) == 1 and lines[0].startswith("  5 req/s, 2 seeds: TTFA p95 mean")
    levels = [
        {"level": 5, "ttfa": {"p95": p}, "ok": 10, "requests_with_underrun": u} for p, u in ((0.05, 1), (0.07, 0))
    ]
    assert sf.summary(levels).endswith("TTFA p95 mean 60 ms (50-70), underrun mean 5.0 %")


def test_admission_hold_groups_prefills_at_a_cost_in_time_to_first_audio():
    """The engine's admission hold (the same rule, engines/native/admission.py) in the model: an
    open loop whose requests arrive while others decode gets fewer prefills with it, and its
    first audio later by up to the hold."""
    load = sf.Load(frames=20, rate=20.0, duration=6.0, warmup=0.5, seed=1)
    off = sf.simulate(_policy(), FLAT, load, max_num_seqs=8)
    on = sf.simulate(_policy(), FLAT, load, max_num_seqs=8, admit_hold_ms=30.0, admit_hold_requests=4)
    assert on["prefills"] < off["prefills"]
    assert off["ttfa"]["p50"] < on["ttfa"]["p50"] <= off["ttfa"]["p50"] + 0.030 + 0.011
