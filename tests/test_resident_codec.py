"""Resident codec state: the stateful codec keeps each stream's state by stream id.

Unit: StatePool (slots, gather/scatter, capacity, expiry), request validation, run_resident_batch
with the tiny StatefulCodecDecoder (interleaved streams of different chunk sizes == whole decode,
also through the CUDA-graph runner's padding path on CPU), ResidentSession and TtsService (release
on end, cancel and error), the repository's resident codec config. The real-server tests are in
test_stateful_serving.py (its server runs both state modes).
"""

import asyncio
import re

import numpy as np

import pytest
import torch

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.errors import error_code_name
from triton_qwen3_tts.serving.model_config import CodecModelConfig, ModelConfigError, TtsModelConfig
from triton_qwen3_tts.serving.codec.stateful import (
    StateCapacityError,
    StatePool,
    new_stream_id,
    parse_resident_request,
    run_resident_batch,
)
from triton_qwen3_tts.serving.tts.codec_session import ResidentSession
from triton_qwen3_tts.serving.tts.service import Metrics, TtsService
from test_tts_service import Sender  # the recording fake Sender of the tts service tests

SPF = 1920


@pytest.fixture(scope="module")
def tiny():
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.model.config import CodecDecoderConfig

    torch.manual_seed(0)
    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config("tiny")["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(cfg), 0).eval()
    return dec, StatefulCodecDecoder(dec), cfg.codebook_size


def codes_of(n, seed, size=2048):
    return np.random.default_rng(seed).integers(0, size, size=(n, 16))


def req(sid, codes=None, start=False, end=False):
    return parse_resident_request(
        None if codes is None else codes[None], np.array([sid], np.uint64), np.array([start]), np.array([end])
    )


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# ---------------------------------------------------------------------------------------------
# StatePool


def test_pool_layout_gather_scatter_roundtrip(tiny):
    _, sd, _ = tiny
    pool = StatePool(sd, 4)
    assert pool.row_numel + 1 == sum(int(np.prod(s[1:])) for s in sd.state_shapes(1).values())
    slots = [pool.open(10), pool.open(11), pool.open(12)]
    assert slots == [0, 1, 2] and pool.live == 3
    new = sd.init_state(2)
    for i, n in enumerate(new):
        new[n] = torch.full_like(new[n], i + 1) if n != "pos" else torch.tensor([5, 7])
    pool.scatter([2, 0], new)
    got = pool.gather([0, 1, 2])
    for i, n in enumerate(sd.state_names()):
        assert tuple(got[n].shape) == tuple(sd.state_shapes(3)[n]), n
        if n == "pos":
            assert got[n].tolist() == [7, 0, 5]
        else:
            assert (
                bool((got[n][0] == i + 1).all()) and bool((got[n][1] == 0).all()) and bool((got[n][2] == i + 1).all())
            )
    # a released and reopened slot starts from zero state
    assert pool.release(12) and not pool.release(12)
    assert pool.open(13) == 2
    assert all(bool((v[0] == 0).all()) for v in pool.gather([2]).values())


def test_pool_errors_capacity_and_expiry(tiny):
    _, sd, _ = tiny
    clock = Clock()
    pool = StatePool(sd, 2, idle_timeout_s=10, clock=clock)
    pool.open(1)
    with pytest.raises(ValueError, match="stream_id 1 is already open"):
        pool.open(1)
    with pytest.raises(ValueError, match="unknown stream_id 9"):
        pool.slot(9)
    pool.open(2)
    with pytest.raises(StateCapacityError, match="all 2 codec state slots"):
        pool.open(3)
    clock.t = 8
    pool.slot(1)  # a request keeps stream 1 alive
    clock.t = 12
    assert pool.expire() == [2] and pool.live == 1 and pool.expired_total == 1
    assert 1 in pool and 2 not in pool
    assert StatePool(sd, 1, idle_timeout_s=0, clock=clock).expire() == []
    with pytest.raises(ValueError, match="capacity"):
        StatePool(sd, 0)


# ---------------------------------------------------------------------------------------------
# Requests


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(codes=None, sid=None), "stream_id is required"),
        (dict(codes=np.zeros((1, 2, 16)), sid=np.array([1, 2], np.uint64)), "exactly one value"),
        (dict(codes=np.zeros((1, 2, 16)), sid=np.array([1.0])), "unsigned integer"),
        (dict(codes=np.zeros((1, 2, 16)), sid=np.array([-1])), ">= 0"),
        (dict(codes=None, sid=np.array([1], np.uint64)), "audio_codes is required"),
        (dict(codes=None, sid=np.array([1], np.uint64), start=True, end=True), "audio_codes is required"),
        (dict(codes=np.zeros((2, 2, 16), np.int64), sid=np.array([1], np.uint64)), r"shape \[1, frames>=1, 16\]"),
        (dict(codes=np.zeros((1, 0, 16), np.int64), sid=np.array([1], np.uint64)), r"shape \[1, frames>=1, 16\]"),
        (dict(codes=np.zeros((1, 2, 16), np.float32), sid=np.array([1], np.uint64)), "integers"),
        (dict(codes=np.full((1, 2, 16), 5000), sid=np.array([1], np.uint64)), r"\[0, 2048\)"),
        (dict(codes=np.zeros((1, 9, 16), np.int64), sid=np.array([1], np.uint64)), "limit is 8"),
        (
            dict(codes=np.zeros((1, 2, 16), np.int64), sid=np.array([1], np.uint64), start=np.array([True, False])),
            "start must hold exactly one value",
        ),
    ],
)
def test_parse_resident_request_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        parse_resident_request(kw["codes"], kw["sid"], kw.get("start"), kw.get("end"), max_frames=8)


def test_parse_resident_request_ok():
    r = parse_resident_request(None, np.array([[2**64 - 1]], np.uint64), None, np.array([[True]]))
    assert (r.stream_id, r.codes, r.start, r.end, r.frames) == (2**64 - 1, None, False, True, 0)
    r = parse_resident_request(np.ones((1, 3, 16), np.int32), np.array([7], np.uint64), np.array([True]), None)
    assert r.codes.dtype == torch.int64 and r.frames == 3 and r.start and not r.end
    ids = {new_stream_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(0 <= i < 2**63 for i in ids)


# ---------------------------------------------------------------------------------------------
# run_resident_batch with the tiny decoder


def _interleaved(sd, dec, size, step_fn, pool=None):
    """Three streams with different chunk plans, sent as batches of one request per live stream."""
    streams = [codes_of(24, i, size) for i in range(3)]
    plans = [[2, 4, 8, 10], [2, 4, 8, 10], [4, 2, 10, 8]]
    pool = StatePool(sd, 4) if pool is None else pool
    outs, pos = [[] for _ in streams], [0, 0, 0]
    for k in range(4):
        batch = []
        for i in range(3):
            n = plans[i][k]
            batch.append(req(100 + i, streams[i][pos[i] : pos[i] + n], start=k == 0, end=k == 3))
            pos[i] += n
        res = step_fn(batch, pool)
        for i, r in enumerate(res):
            assert not isinstance(r, Exception), r
            assert r.shape == (plans[i][k] * SPF,)
            outs[i].append(r.numpy())
    assert pool.live == 0  # every stream ended with end=true
    with torch.no_grad():
        whole = dec.decode(torch.from_numpy(np.stack(streams))).numpy()
    for i in range(3):
        np.testing.assert_allclose(np.concatenate(outs[i]), whole[i], atol=1e-5, rtol=0)


def test_run_resident_batch_is_exact_for_interleaved_streams(tiny):
    dec, sd, size = tiny
    calls = []

    class Spy:
        def step(self, codes, state):
            calls.append(tuple(codes.shape[:2]))
            return sd.step(codes, state)

    _interleaved(sd, dec, size, lambda batch, pool: run_resident_batch(batch, pool, Spy(), max_batch=2))
    # grouped by T, slices of at most 2 rows: step 0 -> T=2 (2 rows), T=4 (1 row)
    assert calls[:2] == [(2, 2), (1, 4)] and max(b for b, _ in calls) == 2


def test_run_resident_batch_through_the_graph_runner_padding_path(tiny):
    """The CUDA-graph runner's staging and zero-state padding (capture=False on CPU) reads the
    pool's gathered views, which are not contiguous across names."""
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner

    dec, sd, size = tiny
    runner = StatefulGraphRunner(sd, torch.device("cpu"), torch.float32, (1, 4), (2, 4, 8, 10), capture=False)
    _interleaved(sd, dec, size, lambda batch, pool: run_resident_batch(batch, pool, runner))
    assert runner.graph_calls > 0 and runner.eager_calls == 0


def test_graph_runner_moves_pool_state_in_one_copy_each_way(tiny):
    """run_resident_batch steps a graph runner through ``step_pool``: on a graph slot the pool's
    rows go into the runner's flat static input in one gather and come back from its flat output
    in one scatter (the pool's per-name ``gather``/``scatter`` never run), exactly as the eager
    decode of the whole streams. A frame count outside the runner's buckets (split into graph
    steps) still goes through the pool's gather and scatter."""
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner

    dec, sd, size = tiny
    runner = StatefulGraphRunner(sd, torch.device("cpu"), torch.float32, (1, 4), (2, 4, 8, 10), capture=False)
    per_name = []

    class CountingPool(StatePool):
        def gather(self, slots, idx=None):
            per_name.append("gather")
            return super().gather(slots, idx)

        def scatter(self, slots, state, idx=None):
            per_name.append("scatter")
            return super().scatter(slots, state, idx)

    _interleaved(sd, dec, size, lambda batch, pool: run_resident_batch(batch, pool, runner), CountingPool(sd, 4))
    assert per_name == [] and runner.graph_calls > 0
    (res,) = run_resident_batch([req(7, codes_of(6, 0, size), start=True, end=True)], CountingPool(sd, 2), runner)
    assert res.shape == (6 * SPF,) and per_name == ["gather", "scatter"] and runner.split_calls == 1


def test_run_resident_batch_errors_do_not_touch_other_streams(tiny):
    _, sd, size = tiny
    pool = StatePool(sd, 2)
    a, b = codes_of(6, 1, size), codes_of(6, 2, size)
    res = run_resident_batch(
        [
            req(1, a[:2], start=True),
            req(2, b[:2], start=True),
            req(1, a[2:4]),
            req(3, a[:2]),
            req(4, a[:2], start=True),
        ],
        pool,
        sd,
    )
    assert res[0].shape == (2 * SPF,) and res[1].shape == (2 * SPF,)
    assert isinstance(res[2], ValueError) and "two requests in one batch" in str(res[2])
    assert isinstance(res[3], ValueError) and "unknown stream_id 3" in str(res[3])
    assert isinstance(res[4], StateCapacityError)
    assert pool.live == 2
    # a duplicate start with end must not release the live stream it collided with
    res = run_resident_batch([req(1, a[2:4], start=True, end=True)], pool, sd)
    assert isinstance(res[0], ValueError) and "already open" in str(res[0]) and 1 in pool
    # release-only requests: empty audio; unknown ids are a no-op
    res = run_resident_batch([req(1, end=True), req(99, end=True)], pool, sd)
    assert [r.shape for r in res] == [(0,), (0,)] and pool.live == 1 and 2 in pool

    class Boom:
        def step(self, codes, state):
            raise RuntimeError("kaput")

    res = run_resident_batch([req(2, b[2:4], end=True)], pool, Boom())
    assert isinstance(res[0], RuntimeError) and "kaput" in str(res[0]) and pool.live == 0  # end releases anyway


# ---------------------------------------------------------------------------------------------
# ResidentSession and TtsService


class FakeResidentCodec:
    """Sessions whose step/release run run_resident_batch on a real pool (tiny decoder)."""

    def __init__(self, sd, fail_at=None):
        self.sd, self.pool, self.fail_at, self.calls, self.releases = sd, StatePool(sd, 4), fail_at, 0, []

    def session(self):
        return ResidentSession(self.step, self.release)

    async def decode(self, codes, left):
        raise AssertionError("the service must use sessions")

    async def step(self, codes, sid, start):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("codec boom")
        r = run_resident_batch([req(sid, codes, start=start)], self.pool, self.sd)[0]
        if isinstance(r, Exception):
            raise r
        return r.numpy()

    async def release(self, sid):
        self.releases.append(sid)
        run_resident_batch([req(sid, end=True)], self.pool, self.sd)


class FakeTalker:
    def __init__(self, frames, delay=0.0):
        self.frames, self.delay, self.aborted = frames, delay, []

    async def stream(self, rid, inputs):
        for i in range(len(self.frames)):
            await asyncio.sleep(self.delay)
            yield self.frames[i : i + 1]

    async def abort(self, rid):
        self.aborted.append(rid)


def service(talker, codec):
    cfg = TtsModelConfig(
        checkpoint="/x",
        first_chunk_frames=2,
        chunk_ramp=(4,),
        chunk_frames=8,
        codec_mode="stateful",
        codec_state="resident",
    )
    return TtsService(cfg, Qwen3TTSConfig.from_dict(presets.main_config("tiny")), talker, codec, Metrics())


def test_service_with_a_resident_codec_is_exact_and_releases(tiny):
    dec, sd, size = tiny
    frames = codes_of(30, 5, size)
    codec, send = FakeResidentCodec(sd), Sender()
    svc = service(FakeTalker(frames), codec)
    asyncio.run(svc.handle({"text": np.array([b"hello"], dtype=object)}, send))
    assert send.finals == 1 and send.items[-1][2]
    with torch.no_grad():
        whole = dec.decode(torch.from_numpy(frames[None])).numpy()[0]
    np.testing.assert_allclose(np.concatenate([x[1] for x in send.items]), whole, atol=1e-5, rtol=0)
    assert len(codec.releases) == 1 and codec.pool.live == 0 and svc.codec_states.value == 0


def test_service_resident_release_on_cancel_and_error(tiny):
    _, sd, size = tiny
    frames = codes_of(30, 6, size)
    codec, send = FakeResidentCodec(sd), Sender()
    n = {"i": 0}

    def cancelled():
        n["i"] += 1
        return n["i"] > 8

    svc = service(FakeTalker(frames, delay=0.001), codec)
    asyncio.run(svc.handle({"text": np.array([b"hello"], dtype=object)}, send, cancelled))
    assert error_code_name(send.items[-1][1]) == "CANCELLED" and send.finals == 1
    assert codec.releases and codec.pool.live == 0 and svc.codec_states.value == 0

    codec, send = FakeResidentCodec(sd, fail_at=2), Sender()
    talker = FakeTalker(frames)
    svc = service(talker, codec)
    asyncio.run(svc.handle({"text": np.array([b"hello"], dtype=object)}, send))
    assert error_code_name(send.items[-1][1]) == "INTERNAL" and "codec boom" in str(send.items[-1][1])
    assert codec.releases and codec.pool.live == 0 and len(talker.aborted) == 1


def test_resident_session_contract():
    calls, released = [], []

    async def step(codes, sid, start):
        calls.append((codes.shape[0], sid, start))
        return np.zeros(codes.shape[0] * SPF, np.float32)

    async def release(sid):
        released.append(sid)

    s = ResidentSession(step, release, stream_id=42)
    s.close()  # never used: nothing to release, sync close is fine
    assert s.closed and not released
    s = ResidentSession(step, release, stream_id=43)
    asyncio.run(s.decode(np.zeros((5, 16)), 2))
    asyncio.run(s.decode(np.zeros((3, 16)), 0))
    assert calls == [(3, 43, True), (3, 43, False)] and s.frames == 6
    with pytest.raises(RuntimeError, match="aclose"):
        s.close()
    asyncio.run(s.aclose())
    asyncio.run(s.aclose())
    assert released == [43]
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(s.decode(np.zeros((1, 16)), 0))


# ---------------------------------------------------------------------------------------------
# Config and repository


def test_instance_count():
    from triton_qwen3_tts.serving.model_config import instance_count

    assert instance_count({"instance_group": [{"kind": "KIND_MODEL", "count": 1}]}) == 1
    assert instance_count({"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0, 1]}]}) == 2
    assert instance_count('{"instance_group": [{"kind": "KIND_CPU", "count": 3}]}') == 3
    assert instance_count({}) == 1


def test_resident_session_retries_a_failed_release_once():
    calls = []

    async def step(codes, sid, start):
        return np.zeros(codes.shape[0] * SPF, np.float32)

    def release_failing(n):
        async def release(sid):
            calls.append(sid)
            if len(calls) <= n:
                raise RuntimeError("codec unreachable")

        return release

    s = ResidentSession(step, release_failing(1), stream_id=5)
    asyncio.run(s.decode(np.zeros((2, 16)), 0))
    asyncio.run(s.aclose())
    assert calls == [5, 5]
    calls.clear()
    s = ResidentSession(step, release_failing(2), stream_id=6)
    asyncio.run(s.decode(np.zeros((2, 16)), 0))
    with pytest.raises(RuntimeError, match="unreachable"):
        asyncio.run(s.aclose())
    assert calls == [6, 6] and s.closed


def test_codec_and_tts_config_state_parameters():
    c = CodecModelConfig.from_parameters(
        {"checkpoint": "/x", "state": "resident", "state_slots": "16", "state_idle_timeout_s": "0"}
    )
    assert (c.state, c.state_slots, c.state_idle_timeout_s) == ("resident", 16, 0.0)
    for params, msg in (
        ({"state": "shared"}, "'state' must be one of request, resident"),
        ({"state_slots": "0"}, "state_slots"),
        ({"state_idle_timeout_s": "-1"}, "state_idle_timeout_s"),
    ):
        with pytest.raises(ModelConfigError, match=msg):
            CodecModelConfig.from_parameters({"checkpoint": "/x", **params})
    with pytest.raises(ModelConfigError, match="codec_state"):
        TtsModelConfig.from_parameters({"checkpoint": "/x", "codec_state": "x"})
    with pytest.raises(ModelConfigError, match="codec_zero_state_start"):
        TtsModelConfig.from_parameters(
            {"checkpoint": "/x", "codec_state": "resident", "codec_zero_state_start": "true"}
        )


def test_repository_resident_codec(tiny_checkpoint, tmp_path):
    from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository
    from test_repository import params

    def parse_pbtxt_parameters(text):  # as the codec model reads them (it drops the backend's own keys)
        return {k: v for k, v in params(text).items() if k != "FORCE_CPU_ONLY_INPUT_TENSORS"}

    s = RepositorySettings(
        checkpoint=str(tiny_checkpoint),
        codec_backend="python",
        device="cpu",
        codec_mode="stateful",
        max_in_flight=8,
        tts_instances=2,
    )
    out = build_repository(s, str(tmp_path / "repo"))
    text = open(f"{out}/codec_decoder_stateful/config.pbtxt").read()
    assert 'name: "stream_id" data_type: TYPE_UINT64' in text and 'name: "end"' in text
    assert 'name: "state_in_' not in text and 'name: "state_out_' not in text and "optional: true  #" in text
    codec = CodecModelConfig.from_parameters(parse_pbtxt_parameters(text))
    assert codec.state == "resident" and codec.state_slots == 2 * 8 * 2 and codec.state_idle_timeout_s == 300
    assert "kind: KIND_CPU count: 1" in text
    gpu = build_repository(
        RepositorySettings(
            checkpoint=str(tiny_checkpoint),
            codec_backend="python",
            device="gpu",
            codec_mode="stateful",
            codec_state_idle_timeout_s=30,
        ),
        str(tmp_path / "gpu"),
    )
    gtext = open(f"{gpu}/codec_decoder_stateful/config.pbtxt").read()
    assert "kind: KIND_MODEL count: 1" in gtext  # one instance whatever the host's GPU count
    assert CodecModelConfig.from_parameters(parse_pbtxt_parameters(gtext)).state_idle_timeout_s == 30
    tts = TtsModelConfig.from_parameters(parse_pbtxt_parameters(open(f"{out}/tts/config.pbtxt").read()))
    assert tts.codec_state == "resident" and tts.codec_mode == "stateful"

    s.codec_state = "request"
    out = build_repository(s, str(tmp_path / "repo2"))
    text = open(f"{out}/codec_decoder_stateful/config.pbtxt").read()
    assert "state_in_attn_0_k" in text and 'name: "stream_id"' not in text and "optional: false" in text
    assert CodecModelConfig.from_parameters(parse_pbtxt_parameters(text)).state == "request"

    assert "kind: KIND_CPU count: 1" in text  # state request: as before
    for kw, msg in (
        (dict(codec_state="both"), "codec_state: must be one of"),
        (dict(codec_state_idle_timeout_s=-1), "codec_state_idle_timeout_s"),
        (dict(codec_state_slots=-1), "codec_state_slots"),
        (
            dict(codec_state="resident", codec_stateful_backend="tensorrt", device="gpu"),
            "codec_state resident needs codec_stateful_backend python",
        ),
    ):
        with pytest.raises(RepositoryError, match=msg):
            build_repository(
                RepositorySettings(
                    checkpoint=str(tiny_checkpoint), codec_backend="python", codec_mode="stateful", **kw
                ),
                str(tmp_path / "bad"),
            )


def test_a_bad_decode_leaves_the_pool_state_as_it_was(tiny):
    """Audio of the wrong shape fails its requests before any state is stored (graph runner and
    eager decoder alike): the streams' states and positions stay where they were."""
    from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner

    dec, sd, size = tiny
    runner = StatefulGraphRunner(sd, torch.device("cpu"), torch.float32, (1, 4), (2, 4), capture=False)

    class Short:  # the decoder's step, returning one sample too few
        def step(self, codes, state):
            audio, new = sd.step(codes, state)
            return audio[:, :-1], new

    real_body = runner._body
    runner._body = lambda slot: real_body(slot)[:, :-1]
    for codec in (runner, Short()):
        pool = StatePool(sd, 2)
        (ok,) = run_resident_batch([req(1, codes_of(2, 0, size), start=True)], pool, sd)  # a good first chunk
        assert ok.shape == (2 * SPF,)
        buf, pos = pool.buf.clone(), pool.pos.clone()
        (res,) = run_resident_batch([req(1, codes_of(2, 1, size))], pool, codec)
        assert isinstance(res, RuntimeError) and "decoder returned audio" in str(res)
        assert torch.equal(pool.buf, buf) and torch.equal(pool.pos, pos)


def test_codec_host_ops_script_counts_few_operations_for_step_pool(capsys):
    """scripts/codec_host_ops.py at the real codec's state layout (38 tensors, built on the meta
    device): step_pool issues a handful of operations per call, the per-name path hundreds."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "codec_host_ops.py"
    spec = importlib.util.spec_from_file_location("codec_host_ops", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--rows", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "38 state tensors" in out
    rows = [[int(x) for x in re.findall(r"\d+", line)] for line in out.splitlines() if re.match(r"\s+[12]\s", line)]
    assert len(rows) == 2
    for _, fast, _, per_name, _ in rows:
        assert fast <= 20 and per_name >= 10 * fast
