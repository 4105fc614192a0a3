"""TtsService with in-process fakes: ordering, trimming, one final response, abort on cancel."""

import asyncio

import numpy as np
import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.errors import error_code_name
from triton_qwen3_tts.serving.model_config import TtsModelConfig
from triton_qwen3_tts.serving.tts.pipeline import trim_window
from triton_qwen3_tts.serving.tts.service import TtsService

SPF = 1920


def fake_decode_full(codes):
    """Causal stand-in for the codec: each sample depends on frames <= its own."""
    cum = np.cumsum(codes.astype(np.float64).sum(-1)) % 997
    return np.repeat(cum, SPF).astype(np.float32) / 997.0


class FakeTalker:
    def __init__(self, frames, per_item=1, delay=0.0):
        self.frames, self.per_item, self.delay = frames, per_item, delay
        self.aborted, self.started = [], []

    async def stream(self, rid, inputs):
        self.started.append((rid, inputs))
        for i in range(0, len(self.frames), self.per_item):
            await asyncio.sleep(self.delay)
            yield self.frames[i : i + self.per_item]

    async def abort(self, rid):
        self.aborted.append(rid)


class FakeCodec:
    def __init__(self):
        self.calls = []

    async def decode(self, codes, left):
        self.calls.append((codes.shape[0], left))
        return trim_window(fake_decode_full(codes), left)


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


def service(talker, codec=None, **kw):
    cfg = TtsModelConfig(
        checkpoint="/x", first_chunk_frames=2, chunk_ramp=(4,), chunk_frames=8, left_context_frames=5, **kw
    )
    return TtsService(cfg, Qwen3TTSConfig.from_dict(presets.main_config("tiny")), talker, codec or FakeCodec())


FRAMES = np.random.default_rng(0).integers(0, 2048, size=(30, 16))


@pytest.mark.parametrize("per_item", [1, 3, 7])
def test_stream_matches_whole_decode_within_window(per_item):
    talker, codec, send = FakeTalker(FRAMES, per_item), FakeCodec(), Sender()
    asyncio.run(service(talker, codec).handle({"text": b("hello")}, send))
    assert send.finals == 1 and send.items[-1][2]
    audio = np.concatenate([x[1] for x in send.items])
    assert audio.shape == (30 * SPF,)
    # The fake is causal with infinite reach, so only chunks whose context covers everything match
    # exactly; check the first chunk exactly and every chunk's length.
    np.testing.assert_array_equal(audio[: 2 * SPF], fake_decode_full(FRAMES[:2]))
    assert all(left <= 5 for _, left in codec.calls)
    assert send.items[0][1].shape[0] == 2 * SPF or per_item > 2


def test_non_stream_and_int16():
    talker, send = FakeTalker(FRAMES, 4), Sender()
    asyncio.run(
        service(talker).handle({"text": b("hi"), "stream": np.array([False]), "sample_format": b("int16")}, send)
    )
    assert len(send.items) == 1 and send.items[0][2]
    assert send.items[0][1].dtype == np.int16 and send.items[0][1].shape == (30 * SPF,)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
def test_sample_rate_resamples_the_stream_to_the_one_shot_result(rate, stream):
    """sample_rate: the streamed chunks, resampled one by one (soxr's stream), add up to the
    whole utterance resampled at once, and every response says the rate."""
    import soxr

    ref_talker, ref_send = FakeTalker(FRAMES, 3), Sender()
    asyncio.run(service(ref_talker).handle({"text": b("hi")}, ref_send))
    at24 = np.concatenate([x[1] for x in ref_send.items])
    talker, send = FakeTalker(FRAMES, 3), Sender()
    inputs = {"text": b("hi"), "sample_rate": np.array([rate], np.int32), "stream": np.array([stream])}
    asyncio.run(service(talker).handle(inputs, send))
    assert send.finals == 1 and set(send.rates) == {rate} and (len(send.items) > 1) == stream
    got = np.concatenate([x[1] for x in send.items])
    want = soxr.resample(at24, 24000, rate, quality="HQ")
    assert abs(got.shape[0] - 30 * SPF * rate / 24000) <= 1
    n = min(got.shape[0], want.shape[0])
    np.testing.assert_allclose(got[:n], want[:n], atol=1e-5)


@pytest.mark.parametrize("rate", [7999, 48001, 0])
def test_sample_rate_out_of_range_is_invalid_arg(rate):
    talker, send = FakeTalker(FRAMES), Sender()
    asyncio.run(service(talker).handle({"text": b("hi"), "sample_rate": np.array([rate], np.int32)}, send))
    kind, err, _ = send.items[-1]
    assert kind == "error" and err.field == "sample_rate" and "8000" in str(err) and not talker.started


def test_invalid_request_gets_one_error_and_no_talker_call():
    talker, send = FakeTalker(FRAMES), Sender()
    asyncio.run(service(talker).handle({"text": b("   ")}, send))
    assert send.finals == 1 and send.items[0][0] == "error"
    assert error_code_name(send.items[0][1]) == "INVALID_ARG" and "text" in str(send.items[0][1])
    assert talker.started == []


def test_cancel_aborts_talker_and_releases_slot():
    talker, send = FakeTalker(FRAMES, 1, delay=0.001), Sender()
    svc = service(talker)
    n = {"i": 0}

    def cancelled():
        n["i"] += 1
        return n["i"] > 5

    asyncio.run(svc.handle({"text": b("hello")}, send, cancelled))
    assert talker.aborted == [talker.started[0][0]]
    assert send.finals == 1 and error_code_name(send.items[-1][1]) == "CANCELLED"
    assert svc.admission.in_flight == 0


def test_overload_refused_with_unavailable():
    async def main():
        talker = FakeTalker(FRAMES, 1, delay=0.01)
        svc = service(talker, max_in_flight=1, max_queued=0)
        s1, s2 = Sender(), Sender()
        t = asyncio.create_task(svc.handle({"text": b("a")}, s1))
        await asyncio.sleep(0.005)
        await svc.handle({"text": b("b")}, s2)
        await t
        return s1, s2, svc

    s1, s2, svc = asyncio.run(main())
    assert s2.finals == 1 and error_code_name(s2.items[0][1]) == "UNAVAILABLE"
    assert s1.finals == 1 and s1.items[-1][0] == "audio"
    assert svc.admission.in_flight == 0


def test_codec_failure_is_one_internal_error_and_aborts():
    class Broken(FakeCodec):
        async def decode(self, codes, left):
            raise RuntimeError("boom")

    talker, send = FakeTalker(FRAMES), Sender()
    asyncio.run(service(talker, Broken()).handle({"text": b("a")}, send))
    assert send.finals == 1 and error_code_name(send.items[0][1]) == "INTERNAL"
    assert len(talker.aborted) == 1


def test_wrong_task_type_for_checkpoint():
    send = Sender()
    asyncio.run(
        service(FakeTalker(FRAMES)).handle({"text": b("a"), "task_type": b("VoiceDesign"), "instruct": b("calm")}, send)
    )
    assert "not served by this checkpoint" in str(send.items[0][1])


@pytest.mark.parametrize(
    "inputs,field",
    [
        ({"speaker": b("nobody")}, "speaker"),
        ({"language": b("klingon")}, "language"),
        ({"language": b("sichuan_dialect")}, "language"),
    ],
)
def test_checkpoint_specific_errors_before_any_work(inputs, field):
    talker, send = FakeTalker(FRAMES), Sender()
    asyncio.run(service(talker).handle({"text": b("hi"), **inputs}, send))
    assert send.finals == 1 and error_code_name(send.items[0][1]) == "INVALID_ARG"
    assert str(send.items[0][1]).startswith(field) and "allowed" in str(send.items[0][1])
    assert talker.started == []


def test_codec_session_is_used_and_closed_once_per_request():
    """A codec with ``session()`` gets one session per request, closed on the end and on errors."""

    class Session:
        def __init__(self, owner):
            self.owner, self.closed = owner, 0

        async def decode(self, codes, left):
            self.owner.lefts.append(left)
            if self.owner.fail:
                raise RuntimeError("boom")
            return trim_window(fake_decode_full(codes), left)

        def close(self):
            self.closed += 1

    class SessionCodec(FakeCodec):
        def __init__(self, fail=False):
            super().__init__()
            self.sessions, self.lefts, self.fail = [], [], fail

        def session(self):
            self.sessions.append(Session(self))
            return self.sessions[-1]

    for fail in (False, True):
        codec, send = SessionCodec(fail), Sender()
        asyncio.run(service(FakeTalker(FRAMES, 3), codec).handle({"text": b("hi")}, send))
        assert send.finals == 1 and codec.calls == []  # decode() of the client itself is not used
        assert [s.closed for s in codec.sessions] == [1]
        assert codec.lefts and (send.items[-1][0] == "error") == fail


class SlotProbe(Sender):
    """Records how many requests the service held in flight when each FINAL went out."""

    def __init__(self, svc):
        super().__init__()
        self.svc, self.in_flight_at_final = svc, []

    def audio(self, samples, final, sample_rate=24000):
        if final:
            self.in_flight_at_final.append(self.svc.admission.in_flight)
        super().audio(samples, final, sample_rate)

    def error(self, err):
        self.in_flight_at_final.append(self.svc.admission.in_flight)
        super().error(err)


@pytest.mark.parametrize("case", ["ok", "cancel", "talker_fails"])
def test_admission_slot_is_free_before_the_final_response(case):
    """A closed-loop client sends its next request when it sees FINAL: the slot must be free then
    (a request admitted at the limit would otherwise be refused), on success, cancel and error."""

    class FailingTalker(FakeTalker):
        async def stream(self, rid, inputs):
            yield self.frames[:3]
            raise RuntimeError("talker: boom")

    talker = FailingTalker(FRAMES) if case == "talker_fails" else FakeTalker(FRAMES, 2)
    svc = service(talker, max_in_flight=1, max_queued=0)
    send = SlotProbe(svc)
    n = {"i": 0}

    def cancelled():
        n["i"] += 1
        return case == "cancel" and n["i"] > 3

    asyncio.run(svc.handle({"text": b("hello")}, send, cancelled))
    assert send.finals == 1 and send.in_flight_at_final == [0], (case, send.items[-1])
    assert svc.admission.in_flight == 0
    expected_last = {"ok": "audio", "cancel": "error", "talker_fails": "error"}[case]
    assert send.items[-1][0] == expected_last


def test_ttfa_breakdown_hooks():
    """first_frames once per request, no later than first_audio; codec_call once per codec call."""
    from triton_qwen3_tts.serving.tts.service import Metrics

    seen = {"first_frames": [], "first_audio": [], "codec_call": []}
    metrics = Metrics(
        first_frames=seen["first_frames"].append,
        first_audio=seen["first_audio"].append,
        codec_call=seen["codec_call"].append,
    )
    talker, codec, send = FakeTalker(FRAMES, 3, delay=0.001), FakeCodec(), Sender()
    cfg = TtsModelConfig(checkpoint="/x", first_chunk_frames=2, chunk_ramp=(4,), chunk_frames=8, left_context_frames=5)
    svc = TtsService(cfg, Qwen3TTSConfig.from_dict(presets.main_config("tiny")), talker, codec, metrics)
    asyncio.run(svc.handle({"text": b("hello")}, send))
    assert send.finals == 1
    assert len(seen["first_frames"]) == 1 and len(seen["first_audio"]) == 1
    assert 0 <= seen["first_frames"][0] <= seen["first_audio"][0]
    assert len(seen["codec_call"]) == len(codec.calls) > 1
    assert all(s >= 0 for s in seen["codec_call"])


class StallingTalker(FakeTalker):
    """Sends ``n_before`` frames, then never another (a talker that hangs)."""

    def __init__(self, n_before):
        super().__init__(FRAMES[:n_before], 1)

    async def stream(self, rid, inputs):
        async for f in super().stream(rid, inputs):
            yield f
        await asyncio.Event().wait()


class DeadPeers:
    """Stands in for stub_procs.StubWatch: reports one dead talker stub once ``kill()`` ran."""

    def __init__(self):
        self.dead = []

    def kill(self):
        from triton_qwen3_tts.serving.stub_procs import Stub

        self.dead = [Stub(pid=4242, model="talker", instance="talker_0_0", parent_pid=1)]

    def poll(self):
        out, self.dead = self.dead, []
        return out


def test_watchdog_ends_a_stalled_request_and_frees_everything():
    """No progress for request_deadline_s: one UNAVAILABLE error naming the setting, the talker
    request aborted, the admission slot free; a request that keeps making progress is untouched."""
    stalled, send = StallingTalker(3), Sender()
    svc = service(stalled, request_deadline_s=0.5)
    healthy_talker, healthy_send = FakeTalker(FRAMES, 1, delay=0.05), Sender()  # 1.5 s, progress every 50 ms
    healthy = service(healthy_talker, request_deadline_s=0.5)

    async def run():
        dogs = [asyncio.ensure_future(s.watchdog(0.05)) for s in (svc, healthy)]
        await asyncio.wait_for(
            asyncio.gather(svc.handle({"text": b("hello")}, send), healthy.handle({"text": b("hello")}, healthy_send)),
            10,
        )
        for d in dogs:
            d.cancel()

    asyncio.run(run())
    assert send.finals == 1 and send.items[-1][0] == "error"
    err = send.items[-1][1]
    assert error_code_name(err) == "UNAVAILABLE" and "request_deadline_s" in str(err)
    assert len(stalled.aborted) == 1
    assert svc.admission.in_flight == 0 and svc.live == {}
    assert healthy_send.finals == 1 and healthy_send.items[-1][0] == "audio"
    assert healthy_talker.aborted == []


def test_watchdog_fails_every_request_when_a_peer_dies():
    """A dead peer process: every request in flight gets UNAVAILABLE within a watchdog pass (no
    talker abort is attempted: it would never be answered), and later requests are refused."""
    peers = DeadPeers()
    talkers = [StallingTalker(2) for _ in range(3)]
    cfg = TtsModelConfig(
        checkpoint="/x",
        first_chunk_frames=2,
        chunk_ramp=(4,),
        chunk_frames=8,
        left_context_frames=5,
        request_deadline_s=600,
    )
    model = Qwen3TTSConfig.from_dict(presets.main_config("tiny"))

    class Talkers:  # one service, a talker per request
        def __init__(self):
            self.i = 0

        def stream(self, rid, inputs):
            self.i += 1
            return talkers[self.i - 1].stream(rid, inputs)

        async def abort(self, rid):
            raise AssertionError("no abort once the talker died")

    svc = TtsService(cfg, model, Talkers(), FakeCodec(), peers=peers)
    sends = [Sender() for _ in range(3)]

    async def run():
        dog = asyncio.ensure_future(svc.watchdog(0.05))
        tasks = [asyncio.ensure_future(svc.handle({"text": b("hello")}, s)) for s in sends]
        await asyncio.sleep(0.2)  # all three streaming, then stalled
        assert len(svc.live) == 3
        peers.kill()
        await asyncio.wait_for(asyncio.gather(*tasks), 2)
        late = Sender()
        await svc.handle({"text": b("hello")}, late)
        dog.cancel()
        return late

    late = asyncio.run(run())
    for s in sends + [late]:
        assert s.finals == 1 and s.items[-1][0] == "error"
        assert error_code_name(s.items[-1][1]) == "UNAVAILABLE" and "talker_0_0" in str(s.items[-1][1])
    assert svc.admission.in_flight == 0 and svc.live == {}
