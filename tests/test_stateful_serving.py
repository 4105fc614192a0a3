"""Serving the stateful codec (docs/design/stateful-codec.md).

Unit: grouping/stacking with a fake decoder and with the tiny StatefulCodecDecoder, request
validation, the pbtxt state I/O, the repository's codec_mode, and TtsService with a fake stateful
codec session (exact audio, state dropped on end/error/cancel).

System (``-m system``): one real tritonserver with codec_mode=stateful (tiny checkpoint, vLLM-CPU
talker, left context 0): greedy stream == whole decode of the reference frames, concurrent streams
batch in codec_decoder_stateful, cancelled streams leave no live codec state.
"""

import asyncio
import concurrent.futures as cf
import os
import re
import time
import urllib.request
from collections import OrderedDict

import numpy as np
import pytest
import torch

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.errors import error_code_name
from triton_qwen3_tts.serving.model_config import ModelConfigError, TtsModelConfig
from triton_qwen3_tts.serving.codec.stateful import (
    config_io_blocks,
    group_by_frames,
    parse_request,
    run_batch,
    state_specs,
)
from triton_qwen3_tts.serving.tts.codec_session import LiveCounter, StatefulSession, WindowedSession, open_session
from triton_qwen3_tts.serving.tts.service import Metrics, TtsService
from system_support import batch_sizes, make_reference, metric, start_tts_server, synth

SPF = 1920


# ---------------------------------------------------------------------------------------------
# A fake stateful decoder: audio sample of frame t = (running sum of codes up to t) % 997 / 997,
# state = the running sum and the position (infinite causal reach: exact only if state is right).


class FakeSD:
    samples_per_frame = SPF

    def __init__(self):
        self.calls = []

    def state_names(self):
        return ["acc", "pos"]

    def onnx_state_names(self):
        return ["state_in_acc", "state_in_pos"], ["state_out_acc", "state_out_pos"]

    def state_shapes(self, batch=1):
        return OrderedDict(acc=(batch, 1), pos=(batch,))

    def init_state(self, batch, device=None, dtype=torch.float32):
        return OrderedDict(acc=torch.zeros(batch, 1, dtype=torch.float64), pos=torch.zeros(batch, dtype=torch.int64))

    def step(self, codes, state):
        b, t, _ = codes.shape
        self.calls.append((b, t, state["pos"].tolist()))
        cum = state["acc"] + torch.cumsum(codes.double().sum(-1), dim=1)  # [b, t]
        audio = (cum % 997 / 997).repeat_interleave(SPF, dim=1).float()
        return audio, OrderedDict(acc=cum[:, -1:].clone(), pos=state["pos"] + t)


def fake_whole(codes):
    cum = np.cumsum(codes.astype(np.float64).sum(-1)) % 997
    return np.repeat(cum / 997, SPF).astype(np.float32)


def codes_of(n, seed):
    return np.random.default_rng(seed).integers(0, 2048, size=(n, 16))


def test_group_by_frames_keeps_first_appearance_order():
    assert group_by_frames([4, 2, 4, 25, 2]) == OrderedDict([(4, [0, 2]), (2, [1, 4]), (25, [3])])


def test_run_batch_groups_by_t_and_carries_state_per_row():
    sd = FakeSD()
    specs = state_specs(sd)
    streams = [codes_of(12, i) for i in range(3)]
    # stream 0 chunks 2,4,6 ; stream 1 chunks 2,4,6 ; stream 2 chunks 4,2,6 (different positions)
    plans = [[2, 4, 6], [2, 4, 6], [4, 2, 6]]
    states, outs, pos = [None] * 3, [[] for _ in range(3)], [0, 0, 0]
    for step in range(3):
        reqs = []
        for i in range(3):
            n = plans[i][step]
            st = None if states[i] is None else {s.input_name: states[i][s.name].numpy() for s in specs}
            reqs.append(parse_request(streams[i][None, pos[i] : pos[i] + n], None, st or {}, specs))
            pos[i] += n
        res = run_batch(reqs, sd, max_batch=8)
        for i, r in enumerate(res):
            assert r.audio.shape == (1, plans[i][step] * SPF)
            assert r.state["pos"].shape == (1, 1) and r.state["pos"].is_contiguous()
            outs[i].append(r.audio[0].numpy())
            states[i] = r.state
    # one step per distinct T: step 0 -> T=2 (2 rows) + T=4 (1 row); step 2 -> one call of 3 rows
    assert [(b, t) for b, t, _ in sd.calls] == [(2, 2), (1, 4), (2, 4), (1, 2), (3, 6)]
    assert sd.calls[-1][2] == [6, 6, 6]
    for i in range(3):
        np.testing.assert_allclose(np.concatenate(outs[i]), fake_whole(streams[i]), atol=1e-6)


def test_run_batch_respects_max_batch_and_multi_row_requests():
    sd = FakeSD()
    specs = state_specs(sd)
    reqs = [parse_request(codes_of(6, i).reshape(2, 3, 16), True, {}, specs) for i in range(3)]  # 2 rows each
    res = run_batch(reqs, sd, max_batch=4)
    assert [(b, t) for b, t, _ in sd.calls] == [(4, 3), (2, 3)]
    for i, r in enumerate(res):
        c = codes_of(6, i).reshape(2, 3, 16)
        assert r.audio.shape == (2, 3 * SPF) and r.state["acc"].shape == (2, 1)
        for j in range(2):
            np.testing.assert_allclose(r.audio[j].numpy(), fake_whole(c[j]), atol=1e-6)


def test_run_batch_with_the_tiny_stateful_decoder_is_exact():
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.model.config import CodecDecoderConfig

    torch.manual_seed(0)
    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config("tiny")["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(cfg), 0).eval()
    sd = StatefulCodecDecoder(dec)
    specs = state_specs(sd)
    a, b = codes_of(10, 1) % cfg.codebook_size, codes_of(10, 2) % cfg.codebook_size
    with torch.no_grad():
        whole = dec.decode(torch.from_numpy(np.stack([a, b])))
    # a: 4 + 6 ; b: 4 + 6, b's second chunk is sent as numpy state through the "wire"
    r1 = run_batch([parse_request(a[None, :4], True, {}, specs), parse_request(b[None, :4], None, {}, specs)], sd)
    wire = [{s.input_name: r.state[s.name].numpy() for s in specs} for r in r1]
    r2 = run_batch(
        [parse_request(a[None, 4:], False, wire[0], specs), parse_request(b[None, 4:], False, wire[1], specs)], sd
    )
    for i in range(2):
        got = torch.cat([r1[i].audio, r2[i].audio], dim=1)[0]
        assert (got - whole[i]).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "codes,start,states,msg",
    [
        (np.zeros((1, 2, 15), np.int64), None, {}, "audio_codes must have shape"),
        (np.zeros((1, 0, 16), np.int64), None, {}, "at least one"),
        (np.zeros((1, 2, 16), np.float32), None, {}, "integers"),
        (np.full((1, 2, 16), 2048), None, {}, "values must be in"),
        (np.zeros((1, 600, 16), np.int64), None, {}, "limit is 512"),
        (np.zeros((1, 2, 16), np.int64), False, {}, "missing state input"),
        (np.zeros((1, 2, 16), np.int64), True, {"state_in_acc": np.zeros((1, 1))}, "start=true takes no"),
        (np.zeros((1, 2, 16), np.int64), None, {"state_in_bogus": np.zeros((1, 1))}, "unknown state"),
        (np.zeros((1, 2, 16), np.int64), None, {"state_in_acc": np.zeros((1, 1))}, "missing state input"),
        (
            np.zeros((1, 2, 16), np.int64),
            None,
            {"state_in_acc": np.zeros((2, 1)), "state_in_pos": np.zeros((1, 1), np.int64)},
            "must have shape [1, 1]",
        ),
        (
            np.zeros((1, 2, 16), np.int64),
            None,
            {"state_in_acc": np.full((1, 1), np.nan), "state_in_pos": np.zeros((1, 1), np.int64)},
            "NaN",
        ),
        (
            np.zeros((1, 2, 16), np.int64),
            None,
            {"state_in_acc": np.zeros((1, 1)), "state_in_pos": np.full((1, 1), -1)},
            ">= 0",
        ),
        (
            np.zeros((1, 2, 16), np.int64),
            None,
            {"state_in_acc": np.zeros((1, 1)), "state_in_pos": np.zeros((1, 1))},
            "int64",
        ),
    ],
)
def test_parse_request_rejects_with_clear_messages(codes, start, states, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_request(codes, start, states, state_specs(FakeSD()), max_frames=512)


def test_config_io_blocks():
    ins, outs = config_io_blocks(state_specs(FakeSD()), "float32")
    assert ins.splitlines() == [
        '  { name: "state_in_acc" data_type: TYPE_FP32 dims: [ 1 ] optional: true },',
        '  { name: "state_in_pos" data_type: TYPE_INT64 dims: [ 1 ] optional: true }',
    ]
    assert outs.splitlines()[1] == '  { name: "state_out_pos" data_type: TYPE_INT64 dims: [ 1 ] }'


def test_repository_codec_mode(tiny_checkpoint, tmp_path):
    from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository

    with pytest.raises(RepositoryError, match="codec_mode"):
        build_repository(
            RepositorySettings(
                checkpoint=str(tiny_checkpoint), codec_backend="python", device="cpu", codec_mode="magic"
            ),
            str(tmp_path / "bad"),
        )
    out = build_repository(
        RepositorySettings(
            checkpoint=str(tiny_checkpoint),
            codec_backend="python",
            device="cpu",
            codec_mode="stateful",
            codec_state="request",
        ),
        str(tmp_path / "r"),
    )
    cfg = open(os.path.join(out, "codec_decoder_stateful", "config.pbtxt")).read()
    assert 'name: "codec_decoder_stateful"' in cfg and "${" not in cfg
    assert cfg.count("optional: true") == 27 and '"state_out_attn_1_v"' in cfg  # 26 states + start
    assert os.path.exists(os.path.join(out, "codec_decoder_stateful", "1", "model.py"))
    assert not os.path.exists(os.path.join(out, "codec_decoder"))  # unused in stateful mode: not loaded
    tts = open(os.path.join(out, "tts", "config.pbtxt")).read()
    assert re.search(r'"codec_model" value: \{ string_value: "codec_decoder_stateful"', tts)
    assert re.search(r'"codec_mode" value: \{ string_value: "stateful"', tts)
    assert re.search(r'"left_context_frames" value: \{ string_value: "0"', tts)
    win = build_repository(
        RepositorySettings(checkpoint=str(tiny_checkpoint), codec_backend="python", device="cpu"), str(tmp_path / "w")
    )
    assert not os.path.exists(os.path.join(win, "codec_decoder_stateful"))
    assert re.search(
        r'"codec_mode" value: \{ string_value: "windowed"', open(os.path.join(win, "tts", "config.pbtxt")).read()
    )


def test_tts_config_codec_mode_validated():
    assert TtsModelConfig.from_parameters({"checkpoint": "/x", "codec_mode": "stateful"}).codec_mode == "stateful"
    with pytest.raises(ModelConfigError, match="codec_mode"):
        TtsModelConfig.from_parameters({"checkpoint": "/x", "codec_mode": "both"})


# ---------------------------------------------------------------------------------------------
# TtsService with a fake stateful codec


class FakeTalker:
    def __init__(self, frames, per_item=1, delay=0.0):
        self.frames, self.per_item, self.delay = frames, per_item, delay
        self.aborted, self.started = [], []

    async def stream(self, rid, inputs):
        self.started.append(rid)
        for i in range(0, len(self.frames), self.per_item):
            await asyncio.sleep(self.delay)
            yield self.frames[i : i + self.per_item]

    async def abort(self, rid):
        self.aborted.append(rid)


class FakeStatefulCodec:
    """Sessions over FakeSD (one row per call), recording lefts and live sessions."""

    def __init__(self, fail_at=None):
        self.sd, self.specs = FakeSD(), state_specs(FakeSD())
        self.open, self.lefts, self.calls, self.fail_at = 0, [], 0, fail_at

    def session(self):
        self.open += 1
        codec = self

        class S(StatefulSession):
            async def decode(self, codes, left):
                codec.lefts.append(left)
                return await super().decode(codes, left)

            def close(self):
                if not self.closed:
                    codec.open -= 1
                super().close()

        return S(self.step)

    async def decode(self, codes, left):
        raise AssertionError("the service must use sessions")

    async def step(self, codes, state):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("codec boom")
        wire = {} if state is None else {s.input_name: state[s.name] for s in self.specs}
        r = run_batch([parse_request(codes[None], state is None, wire, self.specs)], self.sd)[0]
        return r.audio[0].numpy(), {k: v.numpy() for k, v in r.state.items()}


class Sender:
    def __init__(self):
        self.items, self.finals = [], 0

    def audio(self, samples, final, sample_rate=24000):
        self.rates = getattr(self, "rates", []) + [sample_rate]
        self.items.append(("audio", samples, final))
        self.finals += final

    def error(self, err):
        self.items.append(("error", err, True))
        self.finals += 1


def b(s):
    return np.array([s.encode()], dtype=object)


FRAMES = np.random.default_rng(0).integers(0, 2048, size=(30, 16))


def stateful_service(talker, codec, gauge):
    cfg = TtsModelConfig(
        checkpoint="/x",
        first_chunk_frames=2,
        chunk_ramp=(4,),
        chunk_frames=8,
        left_context_frames=72,
        codec_mode="stateful",
    )
    return TtsService(
        cfg,
        Qwen3TTSConfig.from_dict(presets.main_config("tiny")),
        talker,
        codec,
        Metrics(codec_states_live=gauge.append),
    )


@pytest.mark.parametrize("per_item", [1, 3, 7])
def test_service_stateful_stream_is_exact_and_uses_no_left_context(per_item):
    codec, gauge, send = FakeStatefulCodec(), [], Sender()
    svc = stateful_service(FakeTalker(FRAMES, per_item), codec, gauge)
    asyncio.run(svc.handle({"text": b("hello")}, send))
    assert send.finals == 1 and send.items[-1][2]
    np.testing.assert_allclose(np.concatenate([x[1] for x in send.items]), fake_whole(FRAMES), atol=1e-6)
    assert set(codec.lefts) == {0} and codec.open == 0
    assert gauge[0] == 1 and gauge[-1] == 0 and svc.codec_states.value == 0


def test_service_stateful_session_closed_on_cancel_and_error():
    codec, gauge, send = FakeStatefulCodec(), [], Sender()
    talker = FakeTalker(FRAMES, 1, delay=0.001)
    n = {"i": 0}

    def cancelled():
        n["i"] += 1
        return n["i"] > 8

    svc = stateful_service(talker, codec, gauge)
    asyncio.run(svc.handle({"text": b("hello")}, send, cancelled))
    assert error_code_name(send.items[-1][1]) == "CANCELLED" and send.finals == 1
    assert codec.open == 0 and svc.codec_states.value == 0 and gauge[-1] == 0

    codec, gauge, send = FakeStatefulCodec(fail_at=2), [], Sender()
    talker = FakeTalker(FRAMES, 1)
    svc = stateful_service(talker, codec, gauge)
    asyncio.run(svc.handle({"text": b("hello")}, send))
    assert error_code_name(send.items[-1][1]) == "INTERNAL" and "codec boom" in str(send.items[-1][1])
    assert codec.open == 0 and svc.codec_states.value == 0 and len(talker.aborted) == 1


def test_sessions_helpers():
    class Win:
        async def decode(self, codes, left):
            return np.zeros((codes.shape[0] - left) * SPF, np.float32)

    s = open_session(Win())
    assert isinstance(s, WindowedSession) and not s.stateful
    assert asyncio.run(s.decode(np.zeros((5, 16)), 3)).shape == (2 * SPF,)
    counter = LiveCounter()
    seen = []

    async def call(codes, state):
        seen.append((codes.shape[0], state))
        return np.zeros(codes.shape[0] * SPF, np.float32), (state or 0) + codes.shape[0]

    st = StatefulSession(call, counter)
    asyncio.run(st.decode(np.zeros((4, 16)), 0))
    assert counter.value == 1
    asyncio.run(st.decode(np.zeros((7, 16)), 2))  # left context frames are skipped, not re-decoded
    assert seen == [(4, None), (5, 4)] and st.state == 9
    st.close()
    st.close()
    assert counter.value == 0 and st.state is None
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(st.decode(np.zeros((1, 16)), 0))


# ---------------------------------------------------------------------------------------------
# System: a real tritonserver with codec_mode=stateful


TEXT = "Hello world, this is a streaming test."


@pytest.fixture(scope="module", params=["resident", "request"])
def server(request, tiny_checkpoint, tmp_path_factory):
    """The stateful codec in both state modes: kept inside the codec by stream id (resident, the
    default) and sent with every chunk (request)."""
    srv = start_tts_server(
        tiny_checkpoint,
        tmp_path_factory.mktemp(f"tts_stateful_{request.param}"),
        codec_mode="stateful",
        codec_state=request.param,
        max_in_flight=8,
        max_queued=8,
    )
    srv.codec_state = request.param
    yield srv
    srv.stop()


def resident_states(server):
    """The codec's own count of streams it holds state for (state resident); asserts the gauge
    exists so that a missing metric cannot read as zero."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    assert "qwen3_tts_codec_resident_states{" in text, "the resident codec exports no state gauge"
    return metric(server, "qwen3_tts_codec_resident_states")


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    return make_reference(tiny_checkpoint)


@pytest.mark.system
@pytest.mark.vllm
def test_system_stateful_stream_equals_whole_decode(server, reference):
    codes, whole = reference(TEXT, frames=40)
    r = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=40)
    assert r.audio.shape == whole.shape, (r.audio.shape, whole.shape)
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    got = [n // SPF for _, n in r.chunks]
    assert got[0] == 2 and sum(got) == codes.shape[0]
    assert batch_sizes(server, "codec_decoder_stateful"), "codec_decoder_stateful served nothing"
    if server.codec_state == "resident":  # the stream's end released its state inside the codec
        deadline = time.time() + 30
        while resident_states(server) != 0 and time.time() < deadline:
            time.sleep(0.2)
        assert resident_states(server) == 0


@pytest.mark.system
@pytest.mark.vllm
def test_system_resident_codec_direct_requests(server, tiny_checkpoint):
    """The resident codec model on its own, through gRPC: a stream decoded in two chunks equals
    its whole decode; bad stream ids and flag sequences are INVALID_ARG naming the field."""
    if server.codec_state != "resident":
        pytest.skip("state request: the codec takes state tensors (covered by the tests above)")
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from triton_qwen3_tts.model.checkpoint import load_codec_decoder

    c = grpcclient.InferenceServerClient(server.grpc_url)

    def call(sid, codes=None, start=None, end=None):
        ins = []
        for name, arr, dt in (
            ("audio_codes", codes, "INT64"),
            ("stream_id", np.array([[sid]], np.uint64), "UINT64"),
            ("start", None if start is None else np.array([[start]]), "BOOL"),
            ("end", None if end is None else np.array([[end]]), "BOOL"),
        ):
            if arr is not None:
                t = grpcclient.InferInput(name, list(arr.shape), dt)
                t.set_data_from_numpy(arr)
                ins.append(t)
        return c.infer("codec_decoder_stateful", ins).as_numpy("audio_values")

    codes = codes_of(12, 3)[None] % 2048
    a = call(77, codes[:, :5], start=True)
    b_ = call(77, codes[:, 5:], end=True)
    with torch.no_grad():
        whole = load_codec_decoder(tiny_checkpoint).decode(torch.from_numpy(codes)).numpy()
    np.testing.assert_allclose(np.concatenate([a, b_], axis=1), whole, atol=1e-5, rtol=0)
    for kw, msg in (
        (dict(sid=77, codes=codes[:, :2]), "unknown stream_id 77"),  # ended above
        (dict(sid=78), "audio_codes is required"),
        (dict(sid=79, codes=np.full((1, 2, 16), 4096, np.int64), start=True), r"audio_codes values"),
    ):
        with pytest.raises(InferenceServerException, match=msg) as e:
            call(**kw)
        assert "INVALID_ARG" in str(e.value.status()), e.value.status()
    assert call(80, end=True).shape == (1, 0)  # releasing an unknown stream is a no-op


@pytest.mark.system
@pytest.mark.vllm
def test_system_stateful_stream_vs_the_windowed_path(server, reference, tiny_checkpoint):
    """A 120-frame stream through the stateful codec equals the windowed path's audio
    (the tts chunk schedule with 72 frames of left context, decoded here with the same decoder)
    within that path's own window error, measured here against the whole decode, and the whole
    decode within 1e-4. 120 frames: later chunks lose context beyond 72 frames, so the windowed
    path is measurably approximate and the comparison means something."""
    import torch

    from triton_qwen3_tts.model.checkpoint import load_codec_decoder
    from triton_qwen3_tts.serving.tts.chunks import ChunkScheduler, ScheduleConfig

    codes, whole = reference(TEXT, frames=120)
    r = synth(server, text=TEXT, speaker="aiden", temperature=0.0, max_frames=120)
    assert r.audio.shape == whole.shape, (r.audio.shape, whole.shape)
    dec = load_codec_decoder(tiny_checkpoint)
    s = ChunkScheduler(ScheduleConfig(left_context_frames=72))
    parts = []
    with torch.no_grad():
        for c in s.push(codes.shape[0]) + s.flush():
            win = torch.from_numpy(np.ascontiguousarray(codes[c.context_start : c.end], dtype=np.int64))[None]
            parts.append(dec.decode_window(win, c.start - c.context_start)[0].numpy())
    windowed = np.concatenate(parts)
    window_error = float(np.abs(windowed - whole).max())
    assert window_error > 1e-5, window_error  # the windowed path is approximate at 72 frames
    np.testing.assert_allclose(r.audio, whole, atol=1e-4, rtol=0)
    assert float(np.abs(r.audio - windowed).max()) <= window_error + 1e-4


@pytest.mark.system
@pytest.mark.vllm
def test_system_stateful_concurrent_streams_batch(server, reference):
    jobs = [
        (f"Sentence number {i} for the concurrency test.", spk)
        for i, spk in enumerate(["aiden", "vivian", "ryan", "serena"])
    ]
    refs = {j: reference(j[0], j[1], frames=30) for j in jobs}
    before = batch_sizes(server, "codec_decoder_stateful")
    with cf.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda j: synth(server, text=j[0], speaker=j[1], temperature=0.0, max_frames=30), jobs))
    for j, r in zip(jobs, results):
        np.testing.assert_allclose(r.audio, refs[j][1], atol=1e-4, rtol=0)
    after = batch_sizes(server, "codec_decoder_stateful")
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert any(k > 1 and n > 0 for k, n in grew.items()), f"stateful codec batch sizes: {after}"


@pytest.mark.system
@pytest.mark.vllm
def test_system_cancelled_streams_leave_no_codec_state(server):
    from triton_qwen3_tts.tools.client import StreamingClient, build_inputs

    cancelled0 = metric(server, "qwen3_tts_requests_cancelled_total")
    n = 50
    for i in range(n):
        c = StreamingClient(server.grpc_url)
        rid = c.send(build_inputs(text=f"cancel me {i}", max_frames=300, ignore_eos=True))
        c.queues[rid].get(timeout=60)  # the first chunk arrived: the stream holds codec state
        c.close(cancel=True)
    resident = server.codec_state == "resident"
    deadline = time.time() + 90
    while time.time() < deadline:
        if (
            metric(server, "qwen3_tts_requests_cancelled_total") - cancelled0 >= n
            and metric(server, "qwen3_tts_codec_states_live") == 0
            and metric(server, "qwen3_tts_requests_in_flight") == 0
            and (not resident or resident_states(server) == 0)
        ):
            break
        time.sleep(0.5)
    assert metric(server, "qwen3_tts_requests_cancelled_total") - cancelled0 >= n
    assert metric(server, "qwen3_tts_codec_states_live") == 0
    assert metric(server, "qwen3_tts_requests_in_flight") == 0
    if resident:  # every cancelled stream's state was released inside the codec too
        assert resident_states(server) == 0
    r = synth(server, text="after the cancels", max_frames=6)
    assert r.audio.size == 6 * SPF
