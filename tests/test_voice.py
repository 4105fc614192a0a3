"""Base voice cloning in `tts`, pure logic: voice cache, resolution rules, request checks,
the reference codes as codec context, and TtsService with fake encoders (no Triton, no torch)."""

import asyncio

import numpy as np
import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.errors import error_code_name
from triton_qwen3_tts.serving.model_config import ModelConfigError, TtsModelConfig
from triton_qwen3_tts.serving.tts.pipeline import stream_audio, trim_window
from triton_qwen3_tts.serving.tts.request import RequestError, TtsLimits, parse_tts_request
from triton_qwen3_tts.serving.tts.service import TtsService
from triton_qwen3_tts.serving.tts.voice import Voice, VoiceCache, fingerprint, resolve_voice
from triton_qwen3_tts.serving.tts.chunks import ChunkScheduler, ScheduleConfig

SPF = 1920
D = 8
AUDIO = (0.1 * np.sin(np.arange(24000 * 2) / 10)).astype(np.float32)
AUDIO2 = (0.2 * np.sin(np.arange(24000 * 2) / 7)).astype(np.float32)


def b(s):
    return np.array([s.encode()], dtype=object)


def sr(v=24000):
    return np.array([v], np.int32)


class FakeEncoders:
    """Deterministic stand-in: x-vector and codes are functions of the audio."""

    def __init__(self):
        self.calls = []

    async def __call__(self, audio, rate, need_codes):
        self.calls.append(need_codes)
        spk = np.full(D, float(np.sum(audio)) % 1.0 + rate / 1e5, np.float32)
        codes = (
            (np.abs(audio[: 5 * SPF : SPF, None] * 1e4).astype(np.int64) + np.arange(16)) % 2048 if need_codes else None
        )
        return spk, codes


def voice(i=0, codes=True):
    return Voice(
        np.full(D, i, np.float32), np.zeros((3, 16), np.int32) if codes else None, "t" if codes else None, f"fp{i}"
    )


# ---- cache ---------------------------------------------------------------------------------


def test_cache_is_lru_bounded_and_counts_evictions():
    ev, sizes = [], []
    c = VoiceCache(2, on_evict=ev.append, on_size=sizes.append)
    c.put("a", voice(1))
    c.put("b", voice(2))
    assert c.get("a") is not None  # a is now the most recent
    assert c.put("c", voice(3)) == 1  # evicts b
    assert "b" not in c and "a" in c and "c" in c
    assert c.stats.evictions == 1 and ev == [1] and sizes[-1] == 2
    c.put("a", voice(4))  # replace: no eviction
    assert c.get("a").speaker_embedding[0] == 4 and c.stats.evictions == 1


def test_cache_size_zero_stores_nothing_and_bad_sizes_refused():
    c = VoiceCache(0)
    c.put("a", voice())
    assert len(c) == 0
    for bad in (-1, 10**9, 1.5, True):
        with pytest.raises(ValueError):
            VoiceCache(bad)


def test_cached_arrays_are_read_only():
    v = voice()
    with pytest.raises(ValueError):
        v.speaker_embedding[0] = 1


def test_fingerprint_depends_on_samples_and_rate():
    assert fingerprint(AUDIO, 24000) == fingerprint(AUDIO.copy(), 24000)
    assert fingerprint(AUDIO, 24000) != fingerprint(AUDIO, 16000)
    assert fingerprint(AUDIO, 24000) != fingerprint(AUDIO2, 24000)


# ---- resolution ----------------------------------------------------------------------------

LIM = TtsLimits(default_task_type="Base")


def req(**kw):
    return parse_tts_request({"text": b("hi"), "task_type": b("Base"), **kw}, LIM)


def resolve(cache, enc, **kw):
    return asyncio.run(resolve_voice(req(**kw), cache, enc))


def test_first_request_stores_second_hits_without_encoding():
    cache, enc = VoiceCache(4), FakeEncoders()
    r1 = resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), ref_text=b("ref words"), voice_id=b("v1"))
    assert not r1.cache_hit and enc.calls == [True] and r1.ref_codes.shape == (5, 16)
    assert not r1.x_vector_only and r1.ref_text == "ref words"
    r2 = resolve(cache, enc, voice_id=b("v1"))  # voice_id alone: the stored in-context voice
    assert r2.cache_hit and enc.calls == [True]
    np.testing.assert_array_equal(r2.speaker_embedding, r1.speaker_embedding)
    np.testing.assert_array_equal(r2.ref_codes, r1.ref_codes)
    assert r2.ref_text == "ref words" and not r2.x_vector_only
    r3 = resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), ref_text=b("ref words"), voice_id=b("v1"))
    assert r3.cache_hit and enc.calls == [True]  # same audio again: still no encoder run
    r4 = resolve(cache, enc, voice_id=b("v1"), x_vector_only=np.array([True]))
    assert r4.cache_hit and r4.x_vector_only and r4.ref_codes is None and r4.ref_text is None
    assert cache.stats.hits == 3 and cache.stats.misses == 1


def test_other_audio_under_a_stored_id_is_refused_unless_replace_voice():
    cache, enc = VoiceCache(4), FakeEncoders()
    xv = np.array([True])
    r1 = resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), x_vector_only=xv, voice_id=b("v"))
    with pytest.raises(RequestError) as e:
        resolve(cache, enc, ref_audio=AUDIO2, ref_sample_rate=sr(), x_vector_only=xv, voice_id=b("v"))
    assert e.value.field == "voice_id" and "replace_voice" in str(e.value)
    assert error_code_name(e.value) == "INVALID_ARG"
    assert len(enc.calls) == 1  # refused before any encoder ran; the stored voice is unchanged
    np.testing.assert_array_equal(cache.get("v").speaker_embedding, r1.speaker_embedding)
    r2 = resolve(
        cache, enc, ref_audio=AUDIO2, ref_sample_rate=sr(), x_vector_only=xv, voice_id=b("v"), replace_voice=xv
    )
    assert not r2.cache_hit and len(enc.calls) == 2
    assert not np.array_equal(r1.speaker_embedding, r2.speaker_embedding)
    np.testing.assert_array_equal(cache.get("v").speaker_embedding, r2.speaker_embedding)
    assert cache.get("v").fingerprint == fingerprint(AUDIO2, 24000)


class SlowEncoders(FakeEncoders):
    """Encoders that yield to the event loop, so concurrent requests interleave inside encode."""

    async def __call__(self, audio, rate, need_codes):
        await asyncio.sleep(0.01 if float(np.sum(np.abs(audio))) > float(np.sum(np.abs(AUDIO))) else 0.02)
        return await super().__call__(audio, rate, need_codes)


@pytest.mark.parametrize("replace", [False, True])
def test_concurrent_registrations_of_one_id_have_a_defined_outcome(replace):
    """Two requests register voice_id "v" at once with different audio: both miss and encode; the
    first to finish encoding (AUDIO2's, the faster here) is stored. Without replace_voice the
    other is refused; with it both succeed and the last stored (AUDIO's) stays."""
    cache, enc = VoiceCache(4), SlowEncoders()
    kw = dict(ref_sample_rate=sr(), x_vector_only=np.array([True]), voice_id=b("v"))
    if replace:
        kw["replace_voice"] = np.array([True])

    async def both():
        return await asyncio.gather(
            resolve_voice(req(ref_audio=AUDIO, **kw), cache, enc),
            resolve_voice(req(ref_audio=AUDIO2, **kw), cache, enc),
            return_exceptions=True,
        )

    r_audio, r_audio2 = asyncio.run(both())
    assert len(enc.calls) == 2 and not r_audio2.cache_hit
    if replace:
        assert not isinstance(r_audio, Exception)
        assert cache.get("v").fingerprint == fingerprint(AUDIO, 24000)
    else:
        assert isinstance(r_audio, RequestError) and r_audio.field == "voice_id", r_audio
        assert cache.get("v").fingerprint == fingerprint(AUDIO2, 24000)
        np.testing.assert_array_equal(cache.get("v").speaker_embedding, r_audio2.speaker_embedding)


def test_same_audio_registered_concurrently_is_no_conflict():
    cache, enc = VoiceCache(4), SlowEncoders()
    kw = dict(ref_audio=AUDIO, ref_sample_rate=sr(), x_vector_only=np.array([True]), voice_id=b("v"))

    async def both():
        return await asyncio.gather(resolve_voice(req(**kw), cache, enc), resolve_voice(req(**kw), cache, enc))

    r1, r2 = asyncio.run(both())
    np.testing.assert_array_equal(r1.speaker_embedding, r2.speaker_embedding)


def test_replace_voice_needs_ref_audio_and_voice_id_and_task_base():
    with pytest.raises(RequestError) as e:
        req(voice_id=b("v"), replace_voice=np.array([True]))
    assert e.value.field == "replace_voice"
    with pytest.raises(RequestError) as e:
        parse_tts_request({"text": b("hi"), "replace_voice": np.array([True])}, LIM)
    assert e.value.field == "replace_voice"
    assert req(voice_id=b("v")).replace_voice is False


def test_xvector_entry_cannot_serve_in_context_without_audio():
    cache, enc = VoiceCache(4), FakeEncoders()
    r1 = resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), x_vector_only=np.array([True]), voice_id=b("x"))
    assert r1.ref_codes is None and enc.calls == [False]  # x-vector only: the codec encoder did not run
    r2 = resolve(cache, enc, voice_id=b("x"))  # stored mode: x-vector
    assert r2.cache_hit and r2.x_vector_only
    with pytest.raises(RequestError) as e:
        resolve(cache, enc, voice_id=b("x"), x_vector_only=np.array([False]))
    assert e.value.field == "x_vector_only" and "no reference codes" in str(e.value)
    # with the audio and a transcript it is encoded again, codes included, and stored
    r3 = resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), ref_text=b("w"), voice_id=b("x"))
    assert not r3.cache_hit and enc.calls == [False, True] and cache.get("x").ref_codes is not None


def test_unknown_and_evicted_voice_id_is_invalid_arg():
    cache, enc = VoiceCache(1), FakeEncoders()
    with pytest.raises(RequestError) as e:
        resolve(cache, enc, voice_id=b("nobody"))
    assert e.value.field == "voice_id" and "unknown voice_id 'nobody'" in str(e.value)
    assert error_code_name(e.value) == "INVALID_ARG"
    resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), ref_text=b("w"), voice_id=b("a"))
    resolve(cache, enc, ref_audio=AUDIO2, ref_sample_rate=sr(), ref_text=b("w"), voice_id=b("b"))
    assert cache.stats.evictions == 1
    with pytest.raises(RequestError, match="unknown voice_id 'a'"):
        resolve(cache, enc, voice_id=b("a"))
    assert cache.stats.misses == 4 and cache.stats.hits == 0


def test_no_voice_id_encodes_every_time_and_stores_nothing():
    cache, enc = VoiceCache(4), FakeEncoders()
    for _ in range(2):
        r = resolve(cache, enc, ref_audio=AUDIO, ref_sample_rate=sr(), ref_text=b("w"))
        assert not r.cache_hit
    assert len(enc.calls) == 2 and len(cache) == 0 and cache.stats.hits == cache.stats.misses == 0


# ---- request checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,field,msg",
    [
        (dict(voice_id=b("v"), ref_text=b("w")), "ref_text", "without ref_audio"),
        (dict(voice_id=b("x" * 300)), "voice_id", "at most 256"),
        (dict(voice_id=b("a\nb")), "voice_id", "printable"),
        (dict(ref_audio=AUDIO, ref_sample_rate=sr(12345), ref_text=b("w")), "ref_sample_rate", "24000"),
    ],
)
def test_base_request_checks(kw, field, msg):
    with pytest.raises(RequestError) as e:
        req(**kw)
    assert e.value.field == field and msg in str(e.value)


@pytest.mark.parametrize(
    "name,value",
    [("voice_id", b("v")), ("x_vector_only", np.array([True])), ("ref_text", b("w")), ("ref_audio", AUDIO)],
)
def test_reference_inputs_refused_for_other_tasks(name, value):
    with pytest.raises(RequestError) as e:
        parse_tts_request(
            {"text": b("hi"), name: value, **({"ref_sample_rate": sr()} if name == "ref_audio" else {})}, TtsLimits()
        )
    assert e.value.field == name and "only used with task_type Base" in str(e.value)


def test_model_config_voice_cache_size_is_validated():
    assert TtsModelConfig.from_parameters({"checkpoint": "/x", "voice_cache_size": "3"}).voice_cache_size == 3
    for bad in ("-1", "100001"):
        with pytest.raises(ModelConfigError, match="voice_cache_size"):
            TtsModelConfig.from_parameters({"checkpoint": "/x", "voice_cache_size": bad})
    with pytest.raises(ModelConfigError, match="encoder_device"):
        TtsModelConfig.from_parameters({"checkpoint": "/x", "encoder_device": "tpu"})


# ---- reference codes as codec context ------------------------------------------------------


def fake_decode_full(codes):
    """Causal stand-in for the codec: each sample depends on all frames <= its own."""
    cum = np.cumsum(codes.astype(np.float64).sum(-1)) % 997
    return np.repeat(cum, SPF).astype(np.float32) / 997.0


async def _frames(frames, per):
    for i in range(0, len(frames), per):
        yield frames[i : i + per]


@pytest.mark.parametrize("n_prefix,left", [(7, 100), (30, 100), (30, 10), (7, 10)])
def test_prefix_is_context_only(n_prefix, left):
    rng = np.random.default_rng(n_prefix + left)
    prefix, frames = rng.integers(0, 2048, (n_prefix, 16)), rng.integers(0, 2048, (40, 16))
    windows = []

    async def decode(codes, lc):
        windows.append((codes.shape[0], lc))
        return trim_window(fake_decode_full(codes), lc)

    async def run():
        sched = ChunkScheduler(
            ScheduleConfig(first_chunk_frames=2, ramp=(4, 8), chunk_frames=8, left_context_frames=left)
        )
        return [
            c async for c in stream_audio(_frames(frames, 3), decode, sched, prefix=prefix, left_context_frames=left)
        ]

    audio = np.concatenate([c.samples for c in asyncio.run(run())])
    assert audio.shape == (40 * SPF,)
    assert all(w <= left + 8 and lc <= left for w, lc in windows)
    whole = fake_decode_full(np.concatenate([prefix, frames]))[n_prefix * SPF :]
    if n_prefix + 40 <= left:  # context covers everything: exactly the official decode-and-drop
        np.testing.assert_array_equal(audio, whole)
    else:  # the first chunk sees min(prefix, left) frames of reference context
        np.testing.assert_array_equal(
            audio[: 2 * SPF],
            whole[: 2 * SPF]
            if n_prefix <= left
            else trim_window(fake_decode_full(np.concatenate([prefix[-left:], frames[:2]])), left),
        )


# ---- TtsService with fake encoders ---------------------------------------------------------


class FakeTalker:
    def __init__(self, frames):
        self.frames, self.started, self.aborted = frames, [], []

    async def stream(self, rid, inputs):
        self.started.append(inputs)
        for i in range(len(self.frames)):
            yield self.frames[i : i + 1]

    async def abort(self, rid):
        self.aborted.append(rid)


class FakeCodec:
    def __init__(self):
        self.calls = []

    async def decode(self, codes, left):
        self.calls.append((codes.copy(), left))
        return trim_window(fake_decode_full(codes), left)


class Sender:
    def __init__(self):
        self.items = []

    def audio(self, samples, final, sample_rate=24000):
        self.rates = getattr(self, "rates", []) + [sample_rate]
        self.items.append(("audio", samples, final))

    def error(self, err):
        self.items.append(("error", err, True))


FRAMES = np.random.default_rng(1).integers(0, 2048, size=(12, 16))


def base_service(talker, codec, enc, **kw):
    cfg = TtsModelConfig(
        checkpoint="/x", first_chunk_frames=2, chunk_ramp=(4,), chunk_frames=8, left_context_frames=50, **kw
    )
    return TtsService(cfg, Qwen3TTSConfig.from_dict(presets.main_config("tiny-base")), talker, codec, encode=enc)


def test_service_base_in_context_then_cached():
    talker, codec, enc = FakeTalker(FRAMES), FakeCodec(), FakeEncoders()
    svc = base_service(talker, codec, enc)
    first = {
        "text": b("hello"),
        "ref_audio": AUDIO,
        "ref_sample_rate": sr(),
        "ref_text": b("ref"),
        "voice_id": b("v"),
        "temperature": np.array([0.0], np.float32),
    }
    s1 = Sender()
    asyncio.run(svc.handle(first, s1))
    assert [k for k, *_ in s1.items] == ["audio"] * len(s1.items) and s1.items[-1][2]
    ins = talker.started[0]
    assert ins["speaker_embedding"].dtype == np.float32 and ins["speaker_embedding"].shape == (D,)
    assert ins["ref_codes"].dtype == np.int32 and ins["ref_codes"].shape == (5, 16)
    assert ins["ref_text"][0] == b"ref"
    # the first codec window starts with the reference codes (context), its audio is dropped
    codes0, left0 = codec.calls[0]
    np.testing.assert_array_equal(codes0[:5], ins["ref_codes"])
    assert left0 == 5
    audio1 = np.concatenate([x[1] for x in s1.items])
    whole = fake_decode_full(np.concatenate([ins["ref_codes"], FRAMES]))[5 * SPF :]
    np.testing.assert_array_equal(audio1, whole)
    # second request: voice_id only, no encoder run, same talker inputs, same audio
    s2 = Sender()
    asyncio.run(svc.handle({"text": b("hello"), "voice_id": b("v"), "temperature": np.array([0.0], np.float32)}, s2))
    assert enc.calls == [True] and svc.voices.stats.hits == 1
    for k in ("speaker_embedding", "ref_codes", "ref_text"):
        np.testing.assert_array_equal(talker.started[1][k], ins[k])
    np.testing.assert_array_equal(np.concatenate([x[1] for x in s2.items]), audio1)


def test_service_xvector_mode_sends_no_codes():
    talker, codec, enc = FakeTalker(FRAMES), FakeCodec(), FakeEncoders()
    s = Sender()
    asyncio.run(
        base_service(talker, codec, enc).handle(
            {"text": b("hello"), "ref_audio": AUDIO, "ref_sample_rate": sr(), "x_vector_only": np.array([True])}, s
        )
    )
    assert s.items[-1][0] == "audio" and enc.calls == [False]
    assert "ref_codes" not in talker.started[0] and "ref_text" not in talker.started[0]
    assert codec.calls[0][1] == 0  # no reference context


def test_service_unknown_voice_and_encoder_failure_end_the_request_only():
    talker, codec = FakeTalker(FRAMES), FakeCodec()

    async def broken(audio, rate, need_codes):
        raise RuntimeError("encoder exploded")

    svc = base_service(talker, codec, FakeEncoders())
    s = Sender()
    asyncio.run(svc.handle({"text": b("hi"), "voice_id": b("ghost")}, s))
    assert len(s.items) == 1 and s.items[0][0] == "error"
    assert error_code_name(s.items[0][1]) == "INVALID_ARG" and "unknown voice_id" in str(s.items[0][1])
    svc2 = base_service(talker, codec, broken)
    s2 = Sender()
    asyncio.run(
        svc2.handle(
            {"text": b("hi"), "ref_audio": AUDIO, "ref_sample_rate": sr(), "x_vector_only": np.array([True])}, s2
        )
    )
    assert len(s2.items) == 1 and error_code_name(s2.items[0][1]) == "INTERNAL"
    assert talker.started == [] and svc.admission.in_flight == 0 and svc2.admission.in_flight == 0


class FakeStatefulCodec:
    """Per-request sessions that carry all past frames (as the stateful codec's state does)."""

    def __init__(self):
        self.sessions = []

    def session(self):
        codec = self

        class S:
            stateful = True

            def __init__(self):
                self.past, self.calls, self.closed = np.zeros((0, 16), np.int64), [], False
                codec.sessions.append(self)

            async def decode(self, codes, left):
                new = np.asarray(codes)[left:]
                self.calls.append(new.shape[0])
                self.past = np.concatenate([self.past, new])
                return fake_decode_full(self.past)[-new.shape[0] * SPF :]

            def close(self):
                self.closed = True

        return S()

    async def decode(self, codes, left):  # pragma: no cover - sessions are used
        raise AssertionError


def test_service_in_context_primes_a_stateful_codec_session():
    talker, codec, enc = FakeTalker(FRAMES), FakeStatefulCodec(), FakeEncoders()
    cfg = TtsModelConfig(
        checkpoint="/x",
        first_chunk_frames=2,
        chunk_ramp=(2,),
        chunk_frames=3,
        left_context_frames=0,
        codec_mode="stateful",
    )
    svc = TtsService(cfg, Qwen3TTSConfig.from_dict(presets.main_config("tiny-base")), talker, codec, encode=enc)
    s = Sender()
    asyncio.run(svc.handle({"text": b("hello"), "ref_audio": AUDIO, "ref_sample_rate": sr(), "ref_text": b("ref")}, s))
    ref_codes = talker.started[0]["ref_codes"]
    (sess,) = codec.sessions
    assert sess.calls[:2] == [3, 2] and sess.closed  # 5 reference frames primed in chunk_frames pieces
    audio = np.concatenate([x[1] for x in s.items])
    np.testing.assert_array_equal(audio, fake_decode_full(np.concatenate([ref_codes, FRAMES]))[5 * SPF :])


def test_client_builds_reference_inputs():
    from triton_qwen3_tts.tools.client import build_inputs

    d = build_inputs(
        text="a",
        ref_audio=np.array([[16384, -32768]], np.int16),
        ref_sample_rate=16000,
        ref_text="words",
        x_vector_only=False,
        voice_id="anna",
    )
    np.testing.assert_array_equal(d["ref_audio"], np.array([0.5, -1.0], np.float32))
    assert d["ref_sample_rate"].dtype == np.int32 and d["x_vector_only"].dtype == np.bool_
    assert d["voice_id"][0] == b"anna" and d["ref_text"][0] == b"words"
    with pytest.raises(ValueError, match="mono"):
        build_inputs(text="a", ref_audio=np.zeros((2, 5), np.float32))
