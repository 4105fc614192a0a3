"""CUDA-graph runner of the stateful codec (serving/codec/graphs.py) and its config.

The graphs themselves need a GPU (scripts/check_stateful_graphs.py; its H100 output is in
docs/bench/stateful_graphs_h100/).
Here the runner runs with ``capture=False``: the same staging into static buffers, zero-row
padding up to the batch bucket and slicing back, with the padded step called eagerly. Checked
against per-row, unpadded ``sd.step`` on the tiny checkpoint (fp32) with non-zero states at
different positions.
"""

import os
import re

import numpy as np
import pytest
import torch

from triton_qwen3_tts.serving.model_config import DEFAULT_STATEFUL_FRAME_BUCKETS, CodecModelConfig, ModelConfigError
from triton_qwen3_tts.serving.codec.stateful import parse_request, run_batch, state_specs
from triton_qwen3_tts.serving.codec.graphs import (
    StatefulGraphRunner,
    batch_buckets_for,
    graph_key,
    pad_state,
    slice_state,
    split_frames,
    stage_rows,
)
from triton_qwen3_tts.serving.tts.chunks import ScheduleConfig

TOL = 1e-6


# --- config ----------------------------------------------------------------------------------


def test_default_frame_buckets_are_the_chunk_schedule_plus_one():
    s = ScheduleConfig()
    assert DEFAULT_STATEFUL_FRAME_BUCKETS == tuple(sorted({1, s.first_chunk_frames, *s.ramp, s.chunk_frames}))
    assert (
        CodecModelConfig.from_parameters({"checkpoint": "/c"}).stateful_frame_buckets == DEFAULT_STATEFUL_FRAME_BUCKETS
    )
    c = CodecModelConfig.from_parameters({"checkpoint": "/c", "stateful_frame_buckets": " 3, 5,25"})
    assert c.stateful_frame_buckets == (3, 5, 25)


@pytest.mark.parametrize(
    "value, msg",
    [
        ("4,2", "strictly ascending"),
        ("2,2", "strictly ascending"),
        ("0,2", r"in \[1, 512\]"),
        ("1,513", r"in \[1, 512\]"),
        (",", "non-empty"),
        ("1,x", "cannot parse"),
    ],
)
def test_stateful_frame_buckets_validation(value, msg):
    with pytest.raises(ModelConfigError, match=msg) as e:
        CodecModelConfig.from_parameters({"checkpoint": "/c", "stateful_frame_buckets": value})
    assert "stateful_frame_buckets" in str(e.value)


# --- pure helpers ------------------------------------------------------------------------------


def test_batch_buckets_and_graph_key():
    assert batch_buckets_for(None) == (1, 2, 4, 8, 16, 32, 64)
    assert batch_buckets_for(64) == (1, 2, 4, 8, 16, 32, 64)
    assert batch_buckets_for(48) == (1, 2, 4, 8, 16, 32, 48)
    assert batch_buckets_for(1) == (1,)
    with pytest.raises(ValueError, match="max_batch"):
        batch_buckets_for(0)
    bb, fb = (1, 2, 4, 8), (1, 2, 25)
    assert graph_key(3, 25, bb, fb) == (4, 25)
    assert graph_key(1, 1, bb, fb) == (1, 1)
    assert graph_key(8, 2, bb, fb) == (8, 2)
    assert graph_key(3, 24, bb, fb) is None  # frames never padded
    assert graph_key(9, 2, bb, fb) is None  # more rows than the largest bucket
    assert graph_key(0, 2, bb, fb) is None


def test_stage_pad_slice():
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 1
    dst = torch.full((4, 3), 7.0)
    stage_rows(dst, src)
    assert torch.equal(dst[:2], src) and not dst[2:].any()
    with pytest.raises(ValueError, match="cannot stage"):
        stage_rows(torch.zeros(1, 3), src)
    with pytest.raises(ValueError, match="cannot stage"):
        stage_rows(torch.zeros(4, 2), src)
    st = {"a": src, "pos": torch.tensor([5, 9])}
    p = pad_state(st, 3, ["a", "pos"])
    assert p["a"].shape == (3, 3) and p["pos"].tolist() == [5, 9, 0] and p["pos"].dtype == torch.int64
    assert torch.equal(p["a"][:2], src) and not p["a"][2].any()
    s = slice_state(p, 2, ["a", "pos"])
    assert torch.equal(s["a"], src) and s["pos"].tolist() == [5, 9]
    s["a"].add_(1)  # a clone: the buffer is untouched
    assert torch.equal(p["a"][:2], src)


# --- the runner on the tiny checkpoint (capture=False) -----------------------------------------


@pytest.fixture(scope="module")
def sd(tiny_checkpoint):
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder

    dec, _ = load_codec_decoder(str(tiny_checkpoint), "cpu", torch.float32)
    return StatefulCodecDecoder(dec).eval()


def _codes(sd, b, t, seed):
    n = sd.decoder.config.codebook_size
    return torch.from_numpy(np.random.default_rng(seed).integers(0, n, size=(b, t, 16)))


def _states_at(sd, positions, seed):
    """One state row per position (a real, non-zero state: that many frames decoded), stacked."""
    rows = []
    for k, p in enumerate(positions):
        st = sd.init_state(1)
        if p:
            with torch.inference_mode():
                _, st = sd.step(_codes(sd, 1, p, seed + k), st)
        rows.append(st)
    return {n: torch.cat([r[n] for r in rows]) for n in sd.state_names()}


def _max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("b, t", [(1, 2), (3, 4), (5, 25), (8, 1)])
def test_padded_runner_equals_per_row_step(sd, b, t):
    runner = StatefulGraphRunner(
        sd, "cpu", torch.float32, batch_buckets=(1, 2, 4, 8), frame_buckets=(1, 2, 4, 25), capture=False
    )
    positions = [(7 * i + 3 * (i % 2)) % 80 for i in range(b)]  # different positions, some 0
    state = _states_at(sd, positions, seed=10 * b + t)
    codes = _codes(sd, b, t, seed=b + 100 * t)
    audio, new = runner.step(codes, state)
    assert runner.graph_calls == 1 and runner.eager_calls == 0
    assert audio.shape == (b, t * sd.samples_per_frame)
    slot = runner._slots[(graph_key(b, t, runner.batch_buckets, runner.frame_buckets))]
    assert slot.codes.shape[0] >= b  # really padded when b is not a bucket
    worst = 0.0
    with torch.inference_mode():
        for i in range(b):
            a_i, n_i = sd.step(codes[i : i + 1], {n: v[i : i + 1] for n, v in state.items()})
            worst = max(worst, _max_diff(audio[i], a_i[0]))
            for n in sd.state_names():
                assert new[n].shape == state[n].shape
                if n == "pos":
                    assert new[n][i].item() == positions[i] + t
                else:  # states reach |x| ~ 3: 1e-6 relative to their scale (float rounding of
                    # different batch sizes; a wrong row or a corrupted state is O(1) off)
                    scale = max(1.0, n_i[n].abs().max().item())
                    worst = max(worst, _max_diff(new[n][i], n_i[n][0]) / scale)
    assert worst <= TOL, worst
    # outputs are the caller's: a second call must not change them
    before = audio.clone()
    runner.step(_codes(sd, b, t, seed=999), state)
    assert torch.equal(audio, before)


def test_frames_outside_the_list_run_eagerly(sd):
    runner = StatefulGraphRunner(sd, "cpu", torch.float32, batch_buckets=(1, 2, 4), frame_buckets=(2, 4), capture=False)
    state = _states_at(sd, [0, 5, 9], seed=3)
    for t in (3, 5):  # not in the list
        codes = _codes(sd, 3, t, seed=t)
        audio, new = runner.step(codes, state)
        with torch.inference_mode():
            ref, ref_new = sd.step(codes, state)
        assert torch.equal(audio, ref) and torch.equal(new["pos"], ref_new["pos"])
    codes = _codes(sd, 5, 2, seed=1)  # more rows than the largest bucket
    runner.step(codes, _states_at(sd, [0] * 5, seed=0))
    assert runner.eager_calls == 3 and runner.graph_calls == 0 and not runner._slots


def test_split_frames():
    assert split_frames(20, (1, 2, 4, 8, 16, 25)) == (16, 4)
    assert split_frames(23, (1, 2, 4, 8, 16, 25)) == (16, 4, 2, 1)
    assert split_frames(60, (1, 2, 4, 8, 16, 25)) == (25, 25, 8, 2)
    assert split_frames(25, (1, 2, 4, 8, 16, 25)) is None  # a bucket itself: one graph
    assert split_frames(3, (2, 4)) is None and split_frames(6, (2, 4)) == (4, 2)


def test_frames_outside_the_list_run_as_several_graph_steps(sd):
    """T=7 with buckets (1, 2, 4): three padded steps (4 + 2 + 1) that equal one eager step of 7."""
    runner = StatefulGraphRunner(
        sd, "cpu", torch.float32, batch_buckets=(1, 2, 4), frame_buckets=(1, 2, 4), capture=False
    )
    state = _states_at(sd, [0, 5, 9], seed=3)
    codes = _codes(sd, 3, 7, seed=7)
    audio, new = runner.step(codes, state)
    with torch.inference_mode():
        ref, ref_new = sd.step(codes, state)
    assert audio.shape == ref.shape and _max_diff(audio, ref) <= TOL
    for n in ref_new:
        assert _max_diff(new[n], ref_new[n]) <= TOL * max(1.0, ref_new[n].abs().max().item()), n
    assert (runner.split_calls, runner.graph_calls, runner.eager_calls) == (1, 3, 0)


def test_run_batch_through_the_runner_matches_the_decoder(sd):
    """run_batch with the runner in place of sd: same audio and state per request (mixed T,
    a first chunk, a T outside the list), and a stream continued through the wire."""
    specs = state_specs(sd)
    runner = StatefulGraphRunner(sd, "cpu", torch.float32, batch_buckets=(1, 2, 4), frame_buckets=(2, 4), capture=False)
    runner.warmup()
    assert set(runner._slots) == {(b, t) for b in (1, 2, 4) for t in (2, 4)} and runner.captured == ()
    streams = [_codes(sd, 1, 12, seed=s).numpy() for s in range(3)]
    plans = [[2, 4, 3], [4, 2, 3], [2, 4, 5]]
    st_a = [None] * 3
    st_b = [None] * 3
    pos = [0, 0, 0]
    for k in range(3):
        reqs_a, reqs_b = [], []
        for i in range(3):
            n = plans[i][k]
            c = streams[i][:, pos[i] : pos[i] + n]
            pos[i] += n
            wa = {} if st_a[i] is None else {s.input_name: st_a[i][s.name].numpy() for s in specs}
            wb = {} if st_b[i] is None else {s.input_name: st_b[i][s.name].numpy() for s in specs}
            reqs_a.append(parse_request(c, None, wa, specs))
            reqs_b.append(parse_request(c, None, wb, specs))
        ra = run_batch(reqs_a, runner, max_batch=4)
        rb = run_batch(reqs_b, sd, max_batch=4)
        for i in range(3):
            assert _max_diff(ra[i].audio, rb[i].audio) <= TOL
            for s in specs:
                assert ra[i].state[s.name].shape == rb[i].state[s.name].shape
                scale = max(1.0, rb[i].state[s.name].abs().max().item())
                assert _max_diff(ra[i].state[s.name], rb[i].state[s.name]) <= TOL * scale
            st_a[i], st_b[i] = ra[i].state, rb[i].state
    assert runner.graph_calls > 0 and runner.eager_calls > 0  # T=3 and T=5 were eager


def test_runner_arguments(sd):
    with pytest.raises(ValueError, match="CUDA device"):
        StatefulGraphRunner(sd, "cpu", torch.float32)
    with pytest.raises(ValueError, match="frame_buckets must be"):
        StatefulGraphRunner(sd, "cpu", torch.float32, frame_buckets=(4, 2), capture=False)
    with pytest.raises(ValueError, match="batch_buckets must be"):
        StatefulGraphRunner(sd, "cpu", torch.float32, batch_buckets=(), capture=False)


# --- repository ----------------------------------------------------------------------------------


def test_repository_writes_the_stateful_frame_buckets(tiny_checkpoint, tmp_path):
    from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository

    def cfg(**kw):
        out = build_repository(
            RepositorySettings(
                checkpoint=str(tiny_checkpoint), codec_backend="python", device="cpu", codec_mode="stateful", **kw
            ),
            str(tmp_path / "r"),
        )
        return open(os.path.join(out, "codec_decoder_stateful", "config.pbtxt")).read()

    def param(text, key):
        m = re.search(r'key: "%s" value: \{ string_value: "([^"]*)"' % key, text)
        return m and m.group(1)

    text = cfg()
    assert param(text, "stateful_frame_buckets") == ",".join(map(str, DEFAULT_STATEFUL_FRAME_BUCKETS))
    assert param(text, "cuda_graphs") == "false"  # cpu
    text = cfg(first_chunk_frames=3, chunk_ramp="6,12", chunk_frames=20)
    assert param(text, "stateful_frame_buckets") == "1,3,6,12,20"
    assert param(cfg(codec_stateful_frame_buckets="2,25"), "stateful_frame_buckets") == "2,25"
    with pytest.raises(RepositoryError, match="codec_stateful_frame_buckets"):
        cfg(codec_stateful_frame_buckets="25,2")


def _steps_equal_the_decoder(sd, runner, cases):
    """For each ``(b, t, positions)``: the runner's step of ``b`` streams at those positions (a
    real state) and ``t`` new frames gives the eager decoder's audio and state."""
    for b, t, pos in cases:
        state = _states_at(sd, pos, seed=b + t)
        codes = _codes(sd, b, t, seed=b * t)
        audio, new = runner.step(codes, state)
        with torch.inference_mode():
            ref, ref_new = sd.step(codes, state)
        assert audio.shape == ref.shape and _max_diff(audio, ref) <= 1e-5, (b, t)
        for n in ref_new:
            assert _max_diff(new[n], ref_new[n]) <= 1e-5 * max(1.0, ref_new[n].abs().max().item()), (b, t, n)


def _compiled_runner(sd, frame_buckets):
    """A compiled runner on the CPU (backend aot_eager: dynamo traces, no kernels generated)."""
    return StatefulGraphRunner(
        sd,
        "cpu",
        torch.float32,
        batch_buckets=(1, 2, 4),
        frame_buckets=frame_buckets,
        capture=False,
        compile=True,
        compile_backend="aot_eager",
    )


def test_compiled_step_serves_every_slot_and_equals_the_decoder(sd):
    """``compile=True`` (backend aot_eager: dynamo traces the step into one graph with dynamic
    batch and frame dims, no kernels generated) gives the eager decoder's audio and state for
    several (batch bucket, T) slots, and the dims stay dynamic: few compiles serve them all."""
    import torch._dynamo

    torch._dynamo.reset()
    runner = _compiled_runner(sd, frame_buckets=(2, 4))
    counts = torch._dynamo.utils.counters
    counts.clear()
    _steps_equal_the_decoder(sd, runner, ((3, 2, [0, 5, 9]), (2, 4, [3, 0]), (4, 4, [1, 2, 3, 4]), (3, 7, [0, 5, 9])))
    # slots (4,2) (2,4) (4,4) ran through the compiled step (T=7 cannot be split into 2s and 4s:
    # eager); the batch and frame dims are dynamic, so fewer graphs than slots were compiled
    assert runner.graph_calls == 3 and runner.eager_calls == 1
    graphs = counts["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2, dict(counts["stats"])
    torch._dynamo.reset()


def test_compiled_runner_compiles_once_for_every_slot(sd):
    """Warming every slot of a compiled runner compiles the step once: a batch of 1 runs in the
    2-row slot (its padding row is discarded) and one frame runs through the decoder itself, so
    dynamo never sees a size it specialises (each compile of the 1.7B codec took 50-70 s on the
    H100, and four of them kept a server from getting ready). Audio and state stay the decoder's."""
    import torch._dynamo

    torch._dynamo.reset()
    runner = _compiled_runner(sd, frame_buckets=(1, 2, 4))
    assert runner.batch_buckets == (2, 4)
    counts = torch._dynamo.utils.counters
    counts.clear()
    runner.warmup()
    _steps_equal_the_decoder(sd, runner, ((1, 2, [4]), (1, 1, [0]), (3, 1, [0, 5, 9]), (2, 4, [3, 0])))
    assert counts["stats"]["unique_graphs"] == 1, dict(counts["stats"])
    assert runner.eager_calls == 0
    torch._dynamo.reset()


def test_codec_slots_script_reports_every_slot(tmp_path):
    """scripts/codec_slots.py (the per-slot warm-up and call times of the fused pipeline's codec;
    GPU figures in docs/benchmark-history.md, run 29b) on the tiny decoder on the CPU: one row per
    (batch bucket, frame count) slot the fused pipeline warms."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "slots.json"
    cmd = [sys.executable, str(root / "scripts" / "codec_slots.py"), "--preset", "tiny", "--device", "cpu"]
    cmd += ["--dtype", "float32", "--max-batch", "4", "--iters", "1", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    slots = {(r["batch"], r["frames"]) for r in doc["slots"]}
    assert slots == {(b, t) for b in (1, 2, 4) for t in (1, 2, 4, 8, 16, 25)} and doc["complete"] is True
    # --slots: only the slots asked for (the codec goal's slot alone, without warming the rest)
    p = subprocess.run(cmd + ["--slots", "4:25", "2:1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [(r["batch"], r["frames"]) for r in json.loads(out.read_text())["slots"]] == [(4, 25), (2, 1)]
    p = subprocess.run(cmd + ["--slots", "3:25"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "not a slot" in p.stderr


def test_check_script_channels_last_runner_against_reference_layout():
    """scripts/check_stateful_graphs.py --channels-last (how codec_channels_last's GPU parity is
    measured): the runner's decoder on channels-last tensors against the reference layout's eager
    step and whole decode, here on the tiny decoder on the CPU through the runner's padded path."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "scripts" / "check_stateful_graphs.py"), "--preset", "tiny", "--device", "cpu"]
    cmd += ["--no-capture", "--channels-last", "--batch", "1", "3", "--frames", "1", "4", "--iters", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "(runner channels-last)" in p.stdout and "rms |d|" in p.stdout and "PASSED" in p.stdout


def test_codec_profile_script_on_the_cpu(tmp_path):
    """scripts/codec_profile.py (where a codec call's GPU time goes; run 39a-b) on the tiny
    decoder on the CPU: the eager step's time and, in the reference layout, a row per leaf
    module of the step with the convolutions' FLOPs and a total per stage."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(root / "scripts" / "codec_profile.py"), "--preset", "tiny", "--device", "cpu"]
    cmd += ["--dtype", "float32", "--batch", "2", "--frames", "3", "--iters", "1", "--no-channels-last"]
    p = subprocess.run(cmd + ["--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["eager_ms"] > 0
    convs = [r for r in doc["modules"] if r["type"] == "Conv1d"]
    assert convs and all(r["gflop"] > 0 for r in convs)
    assert {"pre_transformer", "decoder.1", "decoder.4"} <= set(doc["stages"])
