"""System test of the OpenAI-compatible gateway: the real CPU tritonserver on the tiny Base
checkpoint, the gateway (``qwen3-tts-gateway``) as its own process, driven by the official
``openai`` client and plain HTTP.

One server and one gateway for the module. Each format's stream is decoded with a library other
than the encoder's writer path (soundfile/libsndfile for WAV, PyAV/FFmpeg's decoders for FLAC,
mp3, Ogg Opus and AAC); the PCM stream is compared sample by sample with the gRPC client's
greedy synthesis of the same request.
"""

import io
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from system_support import metric, server_state, start_on_free_ports, start_tts_server, synth, wait_idle

pytestmark = [pytest.mark.system, pytest.mark.vllm]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPF, RATE = 1920, 24000
FRAMES = 12
TEXT = "Hello from the gateway."
REF_TEXT = "This is the reference transcript."


def ref_wave(seconds=2.0, rate=16000):
    t = np.arange(int(seconds * rate)) / rate
    w = sum(0.2 / k * np.sin(2 * np.pi * k * 150 * t) for k in range(1, 5))
    return (w * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)


class Gateway:
    def __init__(self, grpc_url, voices_dir, log_path):
        self.grpc_url = grpc_url
        self.port = None  # chosen by the first start
        self.voices_dir = str(voices_dir)
        self.log_path = log_path
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        """Start the gateway and wait for its /health: first on a free port (start_on_free_ports: a
        port lost to another process before the gateway's bind is retried on a fresh one), again
        after a stop on the same one (clients hold its URL)."""
        if self.port is not None:
            return self._start([self.port])
        return start_on_free_ports(self._start, 1)

    def _start(self, ports):
        self.port = ports[0]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        args = [sys.executable, "-m", "triton_qwen3_tts.gateway.main", "--triton-url", self.grpc_url]
        args += ["--port", str(self.port), "--voices-dir", self.voices_dir]
        self.log = open(self.log_path, "ab")
        log_at = self.log.tell()
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                with open(self.log_path, "rb") as f:
                    tail = f.read()[log_at:].decode(errors="replace")
                raise AssertionError(f"gateway exited; log {self.log_path}: {tail[-2000:]}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                return self
            except Exception:
                time.sleep(0.2)
        raise AssertionError("gateway did not answer /health within 60 s")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


@pytest.fixture(scope="module")
def stack(tiny_base_checkpoint, tmp_path_factory):
    work = tmp_path_factory.mktemp("gateway")
    srv = start_tts_server(tiny_base_checkpoint, work, left_context_frames=150)
    gw = Gateway(srv.grpc_url, work / "voices", str(work / "gateway.log"))
    try:
        gw.start()
        yield srv, gw
    finally:
        gw.stop()
        srv.stop()


@pytest.fixture(scope="module")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=stack[1].url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def voice(stack):
    """A voice uploaded through POST /v1/audio/voices (in-context: with its transcript)."""
    import httpx
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, ref_wave(), 16000, format="WAV", subtype="PCM_16")
    r = httpx.post(
        stack[1].url + "/v1/audio/voices",
        files={"file": ("ref.wav", buf.getvalue(), "audio/wav")},
        data={"ref_text": REF_TEXT, "id": "anna"},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "anna" and r.json()["sample_rate"] == 16000
    # the same id again: a conflict, not a silent replacement
    r2 = httpx.post(
        stack[1].url + "/v1/audio/voices",
        files={"file": ("ref.wav", buf.getvalue(), "audio/wav")},
        data={"id": "anna"},
        timeout=60,
    )
    assert r2.status_code == 409 and r2.json()["error"]["param"] == "voice", r2.text
    return "anna"


def speech(client, voice, fmt, rate=RATE, **extra):
    body = {"max_frames": FRAMES, "temperature": 0.0, "sample_rate": rate, **extra}
    with client.audio.speech.with_streaming_response.create(
        model="qwen3-tts", voice=voice, input=TEXT, response_format=fmt, extra_body=body
    ) as r:
        assert r.status_code == 200
        parts = list(r.iter_bytes())
        return r.headers.get("content-type"), parts


def decode(fmt, data, rate):
    """(samples, rate) by a decoder independent of the gateway's writer."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767.0, rate
    if fmt == "wav":
        import soundfile as sf

        return sf.read(io.BytesIO(data), dtype="float32")
    # FFmpeg's decoders (the gateway's writers are its encoders and muxers). A streamed FLAC's
    # STREAMINFO cannot hold the length (0: unknown, valid FLAC), which libsndfile 1.2 cannot read.
    import av

    with av.open(io.BytesIO(data)) as c:
        s = c.streams.audio[0]
        frames = [f.to_ndarray() for f in c.decode(s)]
        return np.concatenate([f.reshape(-1) for f in frames]), s.rate


# format -> (requested rate, the rate its decoder reports; Ogg Opus decodes at 48 kHz)
CASES = {
    "pcm": (24000, 24000),
    "wav": (22050, 22050),
    "flac": (16000, 16000),
    "mp3": (24000, 24000),
    "opus": (24000, 48000),
    "aac": (44100, 44100),
}
# encoder delay and padding allowed, in samples at the output rate: two mp3 frames (1152 samples),
# two AAC frames (1024) with the encoder's priming, Opus's pre-skip (312 at 48 kHz) and frame padding
SLACK = {"pcm": 0, "wav": 0, "flac": 0, "mp3": 2304, "opus": 1440, "aac": 2304}


def test_pcm_stream_is_the_grpc_synthesis(stack, client, voice):
    srv, gw = stack
    ctype, parts = speech(client, voice, "pcm")
    assert ctype == "audio/pcm" and len(parts) > 1
    got = np.frombuffer(b"".join(parts), "<i2")
    from triton_qwen3_tts.gateway.voices import VoiceStore

    v = VoiceStore(gw.voices_dir).get(voice)
    ref = synth(
        srv,
        text=TEXT,
        ref_audio=v.audio,
        ref_sample_rate=v.sample_rate,
        ref_text=REF_TEXT,
        voice_id=v.cache_id,
        temperature=0.0,
        max_frames=FRAMES,
    )
    assert ref.audio.shape[0] == FRAMES * SPF
    np.testing.assert_array_equal(got, (np.clip(ref.audio, -1, 1) * 32767).round().astype(np.int16))


def test_tts_sample_rate_input_resamples_on_the_server(stack, voice):
    """The tts model's own sample_rate input (gRPC clients): 16 kHz audio, the rate in every response."""
    srv, gw = stack
    from triton_qwen3_tts.gateway.voices import VoiceStore

    v = VoiceStore(gw.voices_dir).get(voice)
    kw = dict(text=TEXT, ref_audio=v.audio, ref_sample_rate=v.sample_rate, ref_text=REF_TEXT, voice_id=v.cache_id)
    r = synth(srv, temperature=0.0, max_frames=FRAMES, sample_rate=16000, **kw)
    assert r.sample_rate == 16000 and abs(r.audio.shape[0] - FRAMES * SPF * 2 // 3) <= 1 and len(r.chunks) > 1


@pytest.mark.parametrize("fmt", list(CASES))
def test_each_format_streams_and_decodes_to_the_duration_and_rate(client, voice, fmt):
    from triton_qwen3_tts.gateway.audio import supported_formats

    assert fmt in supported_formats(), f"{fmt} not supported in this environment"
    rate, decoded_rate = CASES[fmt]
    _, parts = speech(client, voice, fmt, rate)
    audio, sr = decode(fmt, b"".join(parts), rate)
    assert sr == decoded_rate
    want = FRAMES * SPF / RATE
    assert abs(audio.shape[0] / sr - want) <= (SLACK[fmt] + 1.5) / sr, (fmt, audio.shape[0] / sr, want)
    assert np.sqrt(np.mean(audio.astype(np.float64) ** 2)) > 1e-3  # not silence


def test_sse_stream_format(stack, voice):
    import base64
    import json

    import httpx

    body = {"model": "m", "input": TEXT, "voice": voice, "response_format": "pcm", "stream_format": "sse"}
    body.update(max_frames=FRAMES, temperature=0.0)
    with httpx.stream("POST", stack[1].url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(pcm) == FRAMES * SPF * 2


BAD = [
    ({"input": ""}, "input"),
    ({"voice": "nobody"}, "voice"),
    ({"response_format": "ogg"}, "response_format"),
    ({"speed": 1.5}, "speed"),
    ({"stream_format": "json"}, "stream_format"),
    ({"sample_rate": 96000}, "sample_rate"),
    ({"response_format": "opus", "sample_rate": 22050}, "sample_rate"),
    ({"temperature": -1}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"language": "klingon"}, "language"),  # refused by the server: INVALID_ARG from the tts
    ({"max_frames": 100000}, "max_frames"),  # the server's limit
    ({"volume": 0.5}, "volume"),  # unknown field
]


def test_bad_requests_name_the_field(stack, voice):
    import httpx

    for change, param in BAD:
        body = {"model": "m", "input": TEXT, "voice": voice, "response_format": "wav", "max_frames": FRAMES}
        body.update(change)
        r = httpx.post(stack[1].url + "/v1/audio/speech", json=body, timeout=60)
        assert r.status_code in (400, 422), (change, r.status_code, r.text)
        err = r.json()["error"]
        assert err["param"] == param and param in err["message"], (change, err)
        assert set(err) == {"message", "type", "param", "code"}
    # multipart field missing: FastAPI's 422 in the same shape
    r = httpx.post(stack[1].url + "/v1/audio/voices", data={"ref_text": "x"}, timeout=30)
    assert r.status_code == 422 and r.json()["error"]["param"] == "file", r.text


def test_health_and_ready(stack):
    import httpx

    assert httpx.get(stack[1].url + "/health").json() == {"status": "ok"}
    assert httpx.get(stack[1].url + "/ready").status_code == 200


def test_closing_the_http_stream_cancels_the_triton_request(stack, client, voice):
    srv, _ = stack
    wait_idle(srv)
    with client.audio.speech.with_streaming_response.create(
        model="m",
        voice=voice,
        input=TEXT,
        response_format="pcm",
        # greedy: the random checkpoint then runs 276 frames (~13 s on CPU); sampled, it can draw
        # EOS within the first chunk, and the request ends before the gauge is read
        extra_body={"max_frames": 400, "temperature": 0.0},
    ) as r:
        first = next(r.iter_bytes())
        assert first
        assert metric(srv, "qwen3_tts_requests_in_flight") == 1, server_state(srv)
    # leaving the block closes the connection mid-stream: the gateway cancels the gRPC stream
    wait_idle(srv, timeout=30)
    assert metric(srv, "qwen3_tts_requests_in_flight") == 0


def test_voice_survives_a_gateway_restart_and_is_deleted(stack, client, voice):
    """(A server restart empties the tts model's voice cache; the gateway sends the stored clip
    with every request, so that needs nothing more: not restarted here, it costs ~30 s.)"""
    import httpx

    _, gw = stack
    gw.stop()
    gw.start()
    listed = httpx.get(gw.url + "/v1/audio/voices").json()["data"]
    assert [v["id"] for v in listed if v["type"] == "stored"] == [voice]
    _, parts = speech(client, voice, "wav")
    audio, _ = decode("wav", b"".join(parts), RATE)
    assert audio.shape[0] == FRAMES * SPF
    assert httpx.delete(f"{gw.url}/v1/audio/voices/{voice}").json()["deleted"] is True
    assert httpx.delete(f"{gw.url}/v1/audio/voices/{voice}").status_code == 404
    r = httpx.post(gw.url + "/v1/audio/speech", json={"model": "m", "input": TEXT, "voice": voice}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice"


def test_the_gateway_start_retries_a_port_lost_to_another_process(tmp_path, monkeypatch):
    """A gateway whose port another process bound after free_ports chose it fails to bind
    ("already in use"); Gateway.start tries again on a fresh port (no Triton needed: /health)."""
    import socket

    import httpx
    import system_support

    thief = socket.socket()
    thief.bind(("127.0.0.1", 0))
    thief.listen()
    taken = thief.getsockname()[1]
    offered = [[taken]]
    fresh = system_support.free_ports
    monkeypatch.setattr(system_support, "free_ports", lambda n: offered.pop(0) if offered else fresh(n))
    gw = Gateway("127.0.0.1:1", tmp_path / "voices", str(tmp_path / "gateway.log"))
    try:
        gw.start()
        try:
            assert gw.port != taken and httpx.get(gw.url + "/health").json() == {"status": "ok"}
            assert b"already in use" in (tmp_path / "gateway.log").read_bytes()
        finally:
            gw.stop()
    finally:
        thief.close()
