"""System tests of Base voice cloning: the real tritonserver on the tiny Base checkpoint (vLLM-CPU
talker, Python codec), reference encoders and the voice cache inside `tts`, driven by the
project's client.

The expected audio is the reference model's greedy synthesis, built as the official wrapper
does it: resample the reference to 24 kHz, x-vector from the speaker encoder, codes from the
codec encoder (in-context mode), the package's prompt builder and generate loop, then one whole
decode of ``concat(ref_codes, generated)`` with the reference's samples dropped (the official wrapper's output).
Left context 150 frames covers the tiny decoder's receptive field, so the stream equals that
whole decode (see test_system_tts.py).
"""

import numpy as np
import pytest
import torch
from system_support import metric, start_tts_server, synth

pytestmark = [pytest.mark.system, pytest.mark.vllm]

SPF = 1920
TEXT = "Clone this voice, please."
REF_TEXT = "This is the reference transcript."
RATE = 16000  # the server resamples to 24 kHz


def ref_wave(seed, seconds=2.0, rate=RATE):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 110 + 40 * seed
    w = sum(0.2 / k * np.sin(2 * np.pi * k * f0 * t * (1 + 0.05 * np.sin(3 * t))) for k in range(1, 6))
    return (w * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t)) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture(scope="module")
def server(tiny_base_checkpoint, tmp_path_factory):
    srv = start_tts_server(
        tiny_base_checkpoint, tmp_path_factory.mktemp("base_server"), left_context_frames=150, voice_cache_size=2
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(tiny_base_checkpoint):
    from triton_qwen3_tts.model.audio import resample
    from triton_qwen3_tts.model.checkpoint import load_checkpoint
    from triton_qwen3_tts.model.codec_encoder import encode_reference
    from triton_qwen3_tts.model.generate import generate_codes
    from triton_qwen3_tts.model.prompt import PromptRequest, build_prompt, embed_prompt
    from triton_qwen3_tts.model.sampling import SamplingParams
    from triton_qwen3_tts.model.speaker_encoder import extract_speaker_embedding

    ck = load_checkpoint(tiny_base_checkpoint, dtype=torch.float32, load_encoder=True)
    talker = ck.model.talker

    def ref(text, audio, rate, ref_text=None, frames=30):
        wav = resample(audio, rate)
        spk = extract_speaker_embedding(ck.model.speaker_encoder, wav)
        codes_ref = None if ref_text is None else encode_reference(ck.encoder, wav)
        layout = build_prompt(
            ck.config,
            ck.tokenizer,
            PromptRequest(
                task_type="Base", text=text, ref_text=ref_text, ref_codes=codes_ref, x_vector_only=ref_text is None
            ),
        )
        pe, tr = embed_prompt(layout, talker, spk)
        pad = talker.embed_text([ck.config.tts_pad_token_id])[0]
        codes = generate_codes(
            talker, pe, tr, pad, SamplingParams(do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1)
        )
        full = codes if codes_ref is None else torch.cat([torch.as_tensor(codes_ref), codes])
        with torch.no_grad():
            audio_out = ck.decoder.decode(full[None])[0].numpy()
        skip = 0 if codes_ref is None else codes_ref.shape[0] * SPF
        return codes.numpy(), audio_out[skip:]

    return ref


def encoder_runs(server, which):
    """qwen3_tts_reference_encoder_runs_total for one encoder label."""
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    pat = rf'^qwen3_tts_reference_encoder_runs_total{{[^}}]*encoder="{which}"[^}}]*}} ([0-9.e+-]+)$'
    return sum(float(m.group(1)) for m in re.finditer(pat, text, re.M))


def snapshot(server):
    return {
        "hits": metric(server, "qwen3_tts_voice_cache_hits_total"),
        "misses": metric(server, "qwen3_tts_voice_cache_misses_total"),
        "evictions": metric(server, "qwen3_tts_voice_cache_evictions_total"),
        "speaker": encoder_runs(server, "speaker"),
        "codec": encoder_runs(server, "codec"),
    }


def delta(server, before):
    now = snapshot(server)
    return {k: now[k] - before[k] for k in now}


def test_xvector_mode_streams_the_reference_synthesis(server, reference):
    audio = ref_wave(0)
    codes, expected = reference(TEXT, audio, RATE)
    before = snapshot(server)
    r = synth(
        server,
        text=TEXT,
        ref_audio=audio,
        ref_sample_rate=RATE,
        x_vector_only=True,
        voice_id="xv",
        temperature=0.0,
        max_frames=30,
    )
    assert r.audio.shape == (codes.shape[0] * SPF,) and len(r.chunks) > 1
    np.testing.assert_allclose(r.audio, expected, atol=1e-4, rtol=0)
    # x-vector mode runs the speaker encoder only; the first request with a voice_id is a miss
    assert delta(server, before) == {"hits": 0, "misses": 1, "evictions": 0, "speaker": 1, "codec": 0}


def test_in_context_mode_streams_the_reference_synthesis_and_the_cache_skips_both_encoders(server, reference):
    audio = ref_wave(1, seconds=1.6)
    codes, expected = reference(TEXT, audio, RATE, ref_text=REF_TEXT)
    before = snapshot(server)
    r1 = synth(
        server,
        text=TEXT,
        ref_audio=audio,
        ref_sample_rate=RATE,
        ref_text=REF_TEXT,
        voice_id="icl",
        temperature=0.0,
        max_frames=30,
    )
    assert r1.audio.shape == (codes.shape[0] * SPF,)
    np.testing.assert_allclose(r1.audio, expected, atol=1e-4, rtol=0)
    assert delta(server, before) == {"hits": 0, "misses": 1, "evictions": 0, "speaker": 1, "codec": 1}
    # the same voice by id alone: no encoder runs (the metric shows the hit), same audio
    mid = snapshot(server)
    r2 = synth(server, text=TEXT, voice_id="icl", temperature=0.0, max_frames=30)
    np.testing.assert_allclose(r2.audio, expected, atol=1e-4, rtol=0)
    assert delta(server, mid) == {"hits": 1, "misses": 0, "evictions": 0, "speaker": 0, "codec": 0}


def test_lru_eviction_then_unknown_voice_id(server):
    from triton_qwen3_tts.tools.client import TtsError

    before = snapshot(server)
    for i in range(3):  # capacity 2: the third new voice evicts the least recently used one
        synth(
            server,
            text="hi",
            ref_audio=ref_wave(10 + i),
            ref_sample_rate=RATE,
            x_vector_only=True,
            voice_id=f"lru{i}",
            max_frames=2,
        )
    d = delta(server, before)
    assert d["evictions"] >= 1 and d["misses"] == 3 and d["speaker"] == 3
    with pytest.raises(TtsError) as e:
        synth(server, text="hi", voice_id="lru0", max_frames=2)
    assert e.value.code == "INVALID_ARG" and "unknown voice_id 'lru0'" in str(e.value)
    assert synth(server, text="hi", voice_id="lru2", max_frames=2).audio.size == 2 * SPF
    assert server.is_ready()


def test_other_audio_for_a_stored_voice_id_needs_replace_voice(server):
    from triton_qwen3_tts.tools.client import TtsError

    kw = dict(text="hi", ref_sample_rate=RATE, x_vector_only=True, voice_id="taken", max_frames=2)
    synth(server, ref_audio=ref_wave(20), **kw)
    with pytest.raises(TtsError) as e:
        synth(server, ref_audio=ref_wave(21), **kw)
    assert e.value.code == "INVALID_ARG" and "voice_id:" in str(e.value) and "replace_voice" in str(e.value)
    before = snapshot(server)
    synth(server, ref_audio=ref_wave(21), replace_voice=True, **kw)
    synth(server, ref_audio=ref_wave(21), **kw)  # the replacement is stored: a hit now
    assert delta(server, before)["speaker"] == 1 and delta(server, before)["hits"] == 1


GOOD = ref_wave(5)
BAD = [
    (dict(ref_audio=np.zeros(2 * RATE, np.float32), ref_sample_rate=RATE, x_vector_only=True), "ref_audio", "silence"),
    (dict(ref_audio=GOOD[: RATE // 4], ref_sample_rate=RATE, x_vector_only=True), "ref_audio", "at least"),
    (dict(ref_audio=np.tile(GOOD, 16), ref_sample_rate=RATE, x_vector_only=True), "ref_audio", "at most"),
    (
        dict(
            ref_audio=np.where(np.arange(GOOD.size) == 7, np.nan, GOOD).astype(np.float32),
            ref_sample_rate=RATE,
            x_vector_only=True,
        ),
        "ref_audio",
        "NaN",
    ),
    (
        dict(
            ref_audio=np.where(np.arange(GOOD.size) == 7, np.inf, GOOD).astype(np.float32),
            ref_sample_rate=RATE,
            x_vector_only=True,
        ),
        "ref_audio",
        "Inf",
    ),
    (dict(ref_audio=GOOD, ref_sample_rate=12345, x_vector_only=True), "ref_sample_rate", "16000"),
    (dict(ref_audio=GOOD, ref_sample_rate=RATE), "ref_text", "x_vector_only"),
    (dict(voice_id="never-stored"), "voice_id", "unknown voice_id"),
    (dict(voice_id="xv", ref_text="words"), "ref_text", "without ref_audio"),
    (dict(speaker="aiden", ref_audio=GOOD, ref_sample_rate=RATE, x_vector_only=True), "speaker", "Base"),
]


@pytest.mark.parametrize("inputs,field,msg", BAD, ids=[f"{f}-{m}" for _, f, m in BAD])
def test_bad_references_get_invalid_arg_and_the_server_stays_ready(server, inputs, field, msg):
    from triton_qwen3_tts.tools.client import TtsError

    with pytest.raises(TtsError) as e:
        synth(server, text="hi", max_frames=2, **inputs)
    assert e.value.code == "INVALID_ARG", str(e.value)
    assert f"{field}:" in str(e.value) and msg in str(e.value), str(e.value)
    assert server.is_ready()


def test_wrong_dtypes_are_refused(server):
    """Datatypes the client helper would not send: Triton refuses them against the config."""
    from triton_qwen3_tts.tools.client import StreamingClient, TtsError

    def raw(**arrays):
        with StreamingClient(server.grpc_url) as c:
            return c.receive(
                c.send_raw({"text": (np.array([b"hi"], dtype=object), "BYTES"), **arrays}), 0.0, timeout=60
            )

    for arrays in (
        dict(ref_audio=(GOOD.astype(np.float64), "FP64"), ref_sample_rate=(np.array([RATE], np.int32), "INT32")),
        dict(ref_audio=((GOOD * 3e4).astype(np.int16), "INT16"), ref_sample_rate=(np.array([RATE], np.int32), "INT32")),
        dict(ref_audio=(GOOD, "FP32"), ref_sample_rate=(np.array([RATE], np.int64), "INT64")),
    ):
        with pytest.raises(TtsError) as e:
            raw(**arrays)
        # Triton's own check against the config, before the model runs (INVALID_ARG in Triton; a
        # gRPC stream error carries only the message): it names the input and the expected type.
        name, (_, dt) = [(k, v) for k, v in arrays.items() if v[1] not in ("FP32", "INT32")][0]
        assert f"'{name}' data-type is '{dt}'" in str(e.value) and "expects" in str(e.value), str(e.value)
    assert server.is_ready()
    r = synth(server, text="still fine", ref_audio=GOOD, ref_sample_rate=RATE, x_vector_only=True, max_frames=3)
    assert r.audio.size == 3 * SPF


def test_benchmark_base_with_and_without_the_voice_cache(server, tmp_path):
    """benchmark_service.py --task base --ref-audio: the fresh pass runs both encoders per request,
    the shared pass stores the voice once and then only hits the cache (metrics prove it)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import soundfile as sf

    wav = tmp_path / "ref.wav"
    sf.write(wav, ref_wave(3), RATE)
    js = tmp_path / "b.json"
    before = snapshot(server)
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [
            sys.executable,
            str(root / "benchmark" / "benchmark_service.py"),
            "--url",
            server.grpc_url,
            "--task",
            "base",
            "--ref-audio",
            str(wav),
            "--ref-text",
            REF_TEXT,
            "--concurrency",
            "1",
            "--requests-per-level",
            "2",
            "--warmup",
            "0",
            "--fixed-frames",
            "3",
            "--texts",
            "en",
            "--out-json",
            str(js),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(js.read_text())
    assert data["voice_cache"] == ["fresh", "shared"]
    assert [lv["voice_cache"] for lv in data["levels"]] == ["fresh", "shared"]
    assert all(lv["ok"] == 2 and lv["failures"] == 0 for lv in data["levels"]), data["levels"]
    assert "voice cache comparison" in r.stdout
    # fresh: 2 misses and 2 runs of each encoder; shared: 1 storing miss (+1 run each), then 2 hits
    d = delta(server, before)
    assert {k: d[k] for k in ("hits", "misses", "speaker", "codec")} == {
        "hits": 2,
        "misses": 3,
        "speaker": 3,
        "codec": 3,
    }
    assert d["evictions"] >= 1  # three new voices into a cache of two
    assert server.is_ready()
