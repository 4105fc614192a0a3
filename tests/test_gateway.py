"""The gateway's pure parts without a server: request validation and its mapping to `tts` inputs,
the OpenAI error shape, the streaming encoders (checked with independent decoders), the voice
store, and the FastAPI layer's answers when no server is there (tests/test_system_gateway.py runs
it against the real server)."""

import io
import os
import threading

import numpy as np
import pytest

from triton_qwen3_tts.gateway.audio import (
    FORMATS,
    Resampler,
    allowed_rates,
    encoded_stream_parts,
    supported_formats,
)
from triton_qwen3_tts.gateway.errors import ApiError, from_triton_message
from triton_qwen3_tts.gateway.speech import parse_speech, tts_inputs
from triton_qwen3_tts.gateway.voices import VoiceExists, VoiceStore, decode_clip

OK = {"model": "qwen3-tts", "input": "Hello.", "voice": "vivian"}


def test_defaults_and_mapping_to_a_preset_speaker():
    r = parse_speech(dict(OK))
    assert (r.response_format, r.stream_format, r.sample_rate) == ("mp3", "audio", 24000)
    assert tts_inputs(r) == {"text": "Hello.", "stream": True, "sample_format": "float32", "speaker": "vivian"}
    r = parse_speech(
        dict(
            OK,
            voice={"id": "eric"},
            instructions="calm",
            language="chinese",
            temperature=0.5,
            top_k=20,
            seed=7,
            max_frames=30,
            speed=1.0,
            response_format="wav",
            stream_format="sse",
            sample_rate=16000,
        )
    )
    ins = tts_inputs(r)
    assert ins["speaker"] == "eric" and ins["instruct"] == "calm" and ins["language"] == "chinese"
    assert (ins["temperature"], ins["top_k"], ins["seed"], ins["max_frames"]) == (0.5, 20, 7, 30)
    assert (r.stream_format, r.sample_rate) == ("sse", 16000)
    assert tts_inputs(parse_speech(dict(OK, speaker="aiden")))["speaker"] == "aiden"  # speaker overrides voice


def test_a_stored_voice_maps_to_base_cloning(tmp_path):
    store = VoiceStore(str(tmp_path))
    audio = (0.3 * np.sin(np.arange(32000) / 9)).astype(np.float32)
    ctx = store.add(audio, 16000, "the transcript", "anna")
    xv = store.add(audio, 16000, None, "bob")
    ins = tts_inputs(parse_speech(dict(OK, voice="anna")), ctx)
    assert ins["task_type"] == "Base" and ins["ref_text"] == "the transcript" and ins["ref_sample_rate"] == 16000
    assert ins["voice_id"] == ctx.cache_id and "speaker" not in ins and "x_vector_only" not in ins
    np.testing.assert_array_equal(ins["ref_audio"], audio)
    ins = tts_inputs(parse_speech(dict(OK, voice="bob")), xv)
    assert ins["x_vector_only"] is True and "ref_text" not in ins


BAD = [
    ({"input": None}, "input"),
    ({"input": ""}, "input"),
    ({"input": 5}, "input"),
    ({"voice": ""}, "voice"),
    ({"voice": 3}, "voice"),
    ({"response_format": "ogg"}, "response_format"),
    ({"speed": 1.25}, "speed"),
    ({"speed": "fast"}, "speed"),
    ({"stream_format": "json"}, "stream_format"),
    ({"sample_rate": 7999}, "sample_rate"),
    ({"sample_rate": 48001}, "sample_rate"),
    ({"sample_rate": 16000.5}, "sample_rate"),
    ({"response_format": "opus", "sample_rate": 22050}, "sample_rate"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"max_frames": 0}, "max_frames"),
    ({"instructions": ["x"]}, "instructions"),
    ({"language": 1}, "language"),
    ({"volume": 0.9}, "volume"),
]


@pytest.mark.parametrize("change,param", BAD, ids=[f"{p}={c}" for c, p in BAD])
def test_each_bad_field_is_a_400_naming_it(change, param):
    body = dict(OK)
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(ApiError) as e:
        parse_speech(body)
    err = e.value.body()["error"]
    assert e.value.status == 400 and err["param"] == param and err["message"].startswith(param + ":")
    assert err["type"] == "invalid_request_error" and err["code"]


def test_unsupported_format_lists_the_allowed_values():
    with pytest.raises(ApiError) as e:
        parse_speech(dict(OK, response_format="ogg"))
    for fmt in supported_formats():
        assert fmt in e.value.message


def test_triton_errors_map_to_status_field_and_code():
    e = from_triton_message("[INVALID_ARG] speaker: 'zed' is not a speaker of this checkpoint")
    assert (e.status, e.param, e.code) == (400, "voice", "INVALID_ARG") and "zed" in e.message
    e = from_triton_message("[request id: 12] [INVALID_ARG] text: has 900 characters; the limit is 500")
    assert (e.status, e.param) == (400, "input") and e.message.startswith("input: ")
    e = from_triton_message("[INVALID_ARG] max_frames: must be in [1, 400], got 9")
    assert (e.status, e.param) == (400, "max_frames")
    e = from_triton_message("[UNAVAILABLE] the server is full (8 requests in flight)")
    assert (e.status, e.param, e.code, e.type) == (503, None, "UNAVAILABLE", "service_unavailable")
    assert from_triton_message("[CANCELLED] stopped").status == 499
    assert from_triton_message("something odd").status == 500


def sine(seconds, rate=24000, f=330.0):
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * f * t)).astype(np.float32)


def decode(fmt, data, rate):
    """(samples, rate) with a decoder that is not the gateway's writer."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0, rate
    if fmt == "wav":
        import soundfile as sf

        return sf.read(io.BytesIO(data), dtype="float32")
    import av

    with av.open(io.BytesIO(data)) as c:
        s = c.streams.audio[0]
        x = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(s)])
    if np.issubdtype(x.dtype, np.integer):  # FLAC decodes to int16
        x = x.astype(np.float32) / 32768.0
    return x, s.rate


# encoder delay and padding allowed, in samples at the output rate: two mp3 frames (1152 samples),
# two AAC frames (1024) with the encoder's priming, Opus's pre-skip (312 at 48 kHz) and frame padding
SLACK = {"pcm": 0, "wav": 0, "flac": 0, "mp3": 2304, "opus": 1440, "aac": 2304}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_is_supported_here(fmt):
    assert fmt in supported_formats()  # the environment (requirements/cpu-3-serving.txt) has PyAV


@pytest.mark.parametrize(
    "fmt,rate", [(f, r) for f in FORMATS for r in (8000, 24000, 48000)] + [("wav", 11025), ("flac", 44100)]
)
def test_streamed_encoding_decodes_to_the_duration_and_rate(fmt, rate):
    x = sine(1.3)
    chunks = [x[:3840], x[3840:11520], x[11520:]]  # as the tts streams: a small first chunk
    out = encoded_stream_parts(fmt, rate, chunks)
    parts = out["parts"]
    # at the model's rate the first chunk's bytes go out with it; resampling (soxr's filter delay)
    # and the codecs' frame sizes can hold a short first chunk back until the next one
    assert parts[0] if rate == 24000 else parts[0] or parts[1], "no bytes with the first chunks"
    audio, sr = decode(fmt, b"".join(parts), rate)
    want_rate = 48000 if fmt == "opus" else rate  # Ogg Opus decodes at 48 kHz
    assert sr == want_rate
    assert abs(audio.shape[0] / sr - 1.3) <= (SLACK[fmt] + 1.5) / sr, audio.shape[0] / sr
    if fmt in ("pcm", "wav", "flac"):  # lossless after 16-bit quantization: the resampled signal
        import soxr

        ref = soxr.resample(x, 24000, rate, quality="HQ") if rate != 24000 else x
        n = min(ref.shape[0], audio.shape[0])
        assert np.max(np.abs(audio[:n] - ref[:n])) < 2e-3
    else:  # lossy: the tone is there
        spec = np.abs(np.fft.rfft(audio[int(0.2 * sr) : int(1.0 * sr)]))
        peak = np.argmax(spec) * sr / (2 * (spec.shape[0] - 1))
        assert abs(peak - 330.0) < 5.0, peak


def test_allowed_rates():
    assert allowed_rates("wav") is None and allowed_rates("flac") is None
    assert 22050 not in allowed_rates("opus") and 24000 in allowed_rates("opus")
    assert 24000 in allowed_rates("mp3") and 44100 in allowed_rates("aac")


def test_streaming_resampler_matches_one_shot():
    import soxr

    x = sine(1.0, f=440.0)
    rs = Resampler(24000, 16000)
    out = np.concatenate([rs.process(x[i : i + 1000]) for i in range(0, x.shape[0], 1000)] + [rs.process(x[:0], True)])
    ref = soxr.resample(x, 24000, 16000, quality="HQ")
    assert abs(out.shape[0] - ref.shape[0]) <= 1
    assert np.max(np.abs(out[1000:-1000] - ref[1000 : out.shape[0] - 1000])) < 1e-3
    assert Resampler(24000, 24000).process(x) is not None


def wav_bytes(x, rate, channels=1):
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.stack([x] * channels, 1) if channels > 1 else x, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_decode_clip_mixes_resamples_and_refuses_bad_clips():
    x = sine(2.0, 16000)
    audio, rate = decode_clip(wav_bytes(x, 16000, channels=2))
    assert rate == 16000 and audio.shape == (32000,) and np.max(np.abs(audio - x)) < 1e-3
    audio, rate = decode_clip(wav_bytes(sine(2.0, 12345), 12345))  # not a rate the tts takes
    assert rate == 24000 and abs(audio.shape[0] - 48000) <= 2
    mp3 = b"".join(encoded_stream_parts("mp3", 24000, [sine(2.0)])["parts"])  # through PyAV
    audio, rate = decode_clip(mp3)
    assert rate == 24000 and abs(audio.shape[0] / 24000 - 2.0) < 0.1
    for data, why in (
        (b"", "empty"),
        (b"not audio at all" * 10, "cannot be decoded"),
        (wav_bytes(sine(0.5, 16000), 16000), "s long"),
        (wav_bytes(np.zeros(32000, np.float32), 16000), "silence"),
    ):
        with pytest.raises(ApiError) as e:
            decode_clip(data)
        assert e.value.param == "file" and why in e.value.message


def test_decode_clip_mixes_a_stereo_clip_that_only_ffmpeg_reads():
    import av

    x = sine(2.0, 24000)
    sink = io.BytesIO()
    with av.open(sink, mode="w", format="adts") as out:  # AAC: not a libsndfile format
        st = out.add_stream("aac", rate=24000, layout="stereo")
        packed = np.stack([x, 0.5 * x], axis=1).reshape(1, -1)  # interleaved L R L R ...
        frame = av.AudioFrame.from_ndarray(packed, format="flt", layout="stereo")
        frame.sample_rate = 24000
        for pkt in list(st.encode(frame)) + list(st.encode(None)):
            out.mux(pkt)
    audio, rate = decode_clip(sink.getvalue())
    assert rate == 24000 and abs(audio.shape[0] - 48000) <= 2048
    spec = np.abs(np.fft.rfft(audio[4800:43200]))
    assert abs(np.argmax(spec) * 24000 / (2 * (spec.shape[0] - 1)) - 330.0) < 5.0


def test_voice_design_ignores_voice():
    assert "speaker" not in tts_inputs(parse_speech(dict(OK, instructions="a warm voice")), None, presets=False)


def test_voice_store_persists_conflicts_overwrites_and_deletes(tmp_path):
    root = str(tmp_path / "voices")
    s = VoiceStore(root)
    x = sine(2.0, 16000)
    v = s.add(x, 16000, " words ", "anna")
    assert v.ref_text == "words" and sorted(os.listdir(os.path.join(root, "anna"))) == ["audio.wav", "meta.json"]
    with pytest.raises(VoiceExists) as e:
        s.add(sine(2.0, 16000, 200.0), 16000, None, "anna")
    assert e.value.status == 409 and e.value.param == "voice"
    assert s.get("anna").fingerprint == v.fingerprint  # unchanged
    auto = s.add(x, 16000, None)
    assert auto.id.startswith("voice_")
    # a fresh store (a restarted gateway) loads both, samples exact
    s2 = VoiceStore(root)
    assert sorted(w.id for w in s2.list()) == sorted(["anna", auto.id])
    np.testing.assert_array_equal(s2.get("anna").audio, x)
    assert s2.get("anna").cache_id == v.cache_id and s2.get("anna").ref_text == "words"
    w = s2.add(sine(2.0, 16000, 200.0), 16000, "other", "anna", overwrite=True)
    assert w.cache_id != v.cache_id and VoiceStore(root).get("anna").ref_text == "other"
    assert s2.delete("anna") and not s2.delete("anna") and "anna" not in VoiceStore(root)
    assert not s2.delete("..") and not s2.delete("") and os.path.isdir(root)
    with pytest.raises(ApiError) as e:
        s2.add(x, 16000, None, "../evil")
    assert e.value.param == "id"


def test_voice_store_skips_broken_entries_and_removes_leftovers(tmp_path):
    root = tmp_path / "voices"
    s = VoiceStore(str(root))
    s.add(sine(2.0, 16000), 16000, None, "good")
    (root / ".tmp-dead").mkdir()
    (root / "broken").mkdir()
    (root / "broken" / "meta.json").write_text("{")
    s2 = VoiceStore(str(root))
    assert [v.id for v in s2.list()] == ["good"] and s2.skipped and s2.skipped[0].startswith("broken")
    assert not (root / ".tmp-dead").exists()


def test_concurrent_registrations_of_one_id_store_exactly_one(tmp_path):
    roots = str(tmp_path / "voices")
    stores = [VoiceStore(roots), VoiceStore(roots)]  # two gateways on one folder
    results = []

    def add(i):
        try:
            results.append(stores[i % 2].add(sine(2.0, 16000, 200.0 + 50 * i), 16000, None, "same"))
        except VoiceExists as e:
            results.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if not isinstance(r, Exception)]
    assert len(won) == 1 and len(results) == 6
    assert VoiceStore(roots).get("same").fingerprint == won[0].fingerprint


@pytest.fixture
def app_client(tmp_path):
    from fastapi.testclient import TestClient

    from triton_qwen3_tts.gateway.app import create_app
    from system_support import free_ports

    app = create_app(f"127.0.0.1:{free_ports(1)[0]}", str(tmp_path / "voices"))  # nothing listens there
    with TestClient(app) as c:
        yield c


def test_app_without_a_server(app_client):
    c = app_client
    assert c.get("/health").json() == {"status": "ok"}
    r = c.get("/ready")
    assert r.status_code == 503 and r.json()["error"]["code"] == "UNAVAILABLE"
    r = c.post("/v1/audio/speech", json=dict(OK, speed=2))
    assert r.status_code == 400 and r.json()["error"]["param"] == "speed"
    r = c.post("/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = c.post("/v1/audio/speech", json=dict(OK, response_format="pcm"))
    assert r.status_code == 503 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = c.post("/v1/audio/voices", data={"ref_text": "x"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "file"
    r = c.delete("/v1/audio/voices/nobody")
    assert r.status_code == 404 and r.json()["error"]["param"] == "voice"
    assert c.get("/v1/audio/voices").json() == {"object": "list", "data": []}
    assert c.get("/nowhere").json()["error"]["code"] == "not_found"


def test_sampling_controls_reach_the_tts_under_their_input_names():
    """Every tts sampling input is a speech field, typed as the tts declares it, and forwarded."""
    from triton_qwen3_tts.gateway.speech import SPEECH_FIELDS, parse_speech, tts_inputs
    from triton_qwen3_tts.gateway.upstream import TTS_INPUT_TYPES
    from triton_qwen3_tts.serving.tts.request import SAMPLING_INPUTS, TTS_INPUTS

    assert set(SAMPLING_INPUTS) <= set(SPEECH_FIELDS)
    assert TTS_INPUT_TYPES == {k: v[0] for k, v in TTS_INPUTS.items()}
    body = {"model": "qwen3-tts", "input": "hi", "voice": "a", "response_format": "wav"}
    values = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.1}
    values.update(subtalker_temperature=0.5, subtalker_top_k=10, subtalker_top_p=0.9)
    inputs = tts_inputs(parse_speech({**body, **values}))
    for k, v in values.items():
        assert inputs[k] == pytest.approx(v), k
