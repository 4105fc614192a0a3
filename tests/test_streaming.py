"""Codec chunk schedule (triton_qwen3_tts.serving.tts.chunks): tiling, sizes, context, validation."""

from __future__ import annotations

import importlib
import random

import numpy as np
import pytest

from triton_qwen3_tts.serving.tts.chunks import (
    MAX_FRAMES,
    Chunk,
    ChunkScheduler,
    ScheduleConfig,
    plan_chunks,
    stream_decode,
)


def _random_config(rng: random.Random) -> ScheduleConfig:
    chunk = rng.randint(1, 30)
    return ScheduleConfig(
        first_chunk_frames=rng.randint(1, chunk),
        ramp=tuple(rng.randint(1, chunk) for _ in range(rng.randint(0, 4))),
        chunk_frames=chunk,
        left_context_frames=rng.randint(0, 80),
        samples_per_frame=rng.choice([1920, 7]),
    )


def _random_arrivals(rng: random.Random, total: int) -> list:
    """Bursty arrivals: mostly single frames, sometimes zero, sometimes a big burst."""
    out, left = [], total
    while left:
        kind = rng.random()
        n = 0 if kind < 0.1 else 1 if kind < 0.7 else rng.randint(1, max(1, left))
        n = min(n, left)
        out.append(n)
        left -= n
    return out


def _run(cfg: ScheduleConfig, arrivals: list):
    """Drive a scheduler; return (chunks, frames available when each chunk was emitted)."""
    s = ChunkScheduler(cfg)
    chunks, avail = [], []
    for n in arrivals:
        for c in s.push(n):
            chunks.append(c)
            avail.append(s.total_frames)
    for c in s.flush():
        chunks.append(c)
        avail.append(s.total_frames)
    return chunks, avail


@pytest.mark.parametrize("seed", range(300))
def test_tiling_and_context_for_random_arrivals(seed):
    rng = random.Random(seed)
    cfg = _random_config(rng) if seed % 3 else ScheduleConfig()
    total = rng.randint(0, 300)
    chunks, avail = _run(cfg, _random_arrivals(rng, total))

    # Exact tiling of [0, total): contiguous, non-empty, in order.
    pos = 0
    for c in chunks:
        assert c.start == pos and c.end > c.start
        pos = c.end
    assert pos == total
    # Only a flushed chunk is final, and it is the last one.
    assert [c.final for c in chunks[:-1]] == [False] * (len(chunks) - 1)
    for i, (c, a) in enumerate(zip(chunks, avail)):
        # Never decodes frames that do not exist yet.
        assert c.end <= a
        assert c.context_start == max(0, c.start - cfg.left_context_frames)
        assert c.context_frames == min(cfg.left_context_frames, c.start)
        assert c.trim_samples == c.context_frames * cfg.samples_per_frame
        assert c.window_frames <= cfg.max_window_frames
        if not c.final:
            assert c.frames == cfg.chunk_size(i)
        else:
            assert c.frames <= cfg.chunk_size(i)
            # A final chunk exists only because fewer than a full chunk's frames remained.
            assert c.frames < cfg.chunk_size(i) or i == len(chunks) - 1


@pytest.mark.parametrize("seed", range(20))
def test_boundaries_do_not_depend_on_arrival_pattern_except_the_final_chunk(seed):
    rng = random.Random(1000 + seed)
    cfg = _random_config(rng)
    total = rng.randint(1, 200)
    a, _ = _run(cfg, [1] * total)
    b, _ = _run(cfg, _random_arrivals(rng, total))
    assert [(c.start, c.end, c.context_start) for c in a] == [(c.start, c.end, c.context_start) for c in b]


def test_default_schedule_sizes_first_chunk_and_ramp():
    cfg = ScheduleConfig()
    assert (cfg.first_chunk_frames, cfg.ramp, cfg.chunk_frames, cfg.left_context_frames) == (2, (4, 8, 16), 25, 72)
    assert cfg.max_window_frames == 97
    s = ChunkScheduler(cfg)
    assert s.push(1) == []
    # The first chunk goes out as soon as first_chunk_frames frames exist, without context.
    assert s.push(1) == [Chunk(0, 2, 0, 0, False)]
    sizes = [c.frames for c in plan_chunks(2 + 4 + 8 + 16 + 25 * 4 + 3)]
    assert sizes == [2, 4, 8, 16, 25, 25, 25, 25, 3]
    chunks = plan_chunks(200)
    assert [c.context_frames for c in chunks[:8]] == [0, 2, 6, 14, 30, 55, 72, 72]
    assert chunks[-1].final and chunks[-1].end == 200


def test_burst_gives_several_bounded_chunks_not_one_big_one():
    s = ChunkScheduler(ScheduleConfig())
    chunks = s.push(60)
    assert [c.frames for c in chunks] == [2, 4, 8, 16, 25]
    assert s.pending_frames == 5
    assert s.flush() == [Chunk(55, 60, 0, 55 * 1920, True)]


def test_flush_with_nothing_pending_returns_no_chunk():
    s = ChunkScheduler(ScheduleConfig(first_chunk_frames=2, ramp=()))
    assert len(s.push(2)) == 1
    assert s.flush() == []  # the caller sends an empty final response
    assert ChunkScheduler().flush() == []  # zero-frame stream


def test_flush_short_stream_before_first_chunk():
    s = ChunkScheduler()
    s.push(1)
    assert s.flush() == [Chunk(0, 1, 0, 0, True)]


def test_push_after_flush_and_double_flush_raise():
    s = ChunkScheduler()
    s.flush()
    with pytest.raises(RuntimeError, match="after flush"):
        s.push(1)
    with pytest.raises(RuntimeError, match="twice"):
        s.flush()


@pytest.mark.parametrize("bad", [-1, 1.0, True, "2", None])
def test_push_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="n_new"):
        ChunkScheduler().push(bad)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"first_chunk_frames": 0}, r"first_chunk_frames must be in \[1, "),
        ({"first_chunk_frames": 2.0}, "first_chunk_frames must be an int"),
        ({"first_chunk_frames": True}, "first_chunk_frames must be an int"),
        ({"first_chunk_frames": 30, "chunk_frames": 25}, r"first_chunk_frames \(30\) must be <= chunk_frames \(25\)"),
        ({"chunk_frames": 0}, r"chunk_frames must be in \[1, "),
        ({"chunk_frames": MAX_FRAMES + 1}, "chunk_frames must be in"),
        ({"left_context_frames": -1}, r"left_context_frames must be in \[0, "),
        ({"left_context_frames": "72"}, "left_context_frames must be an int"),
        ({"ramp": (2, 0)}, r"ramp\[1\] must be in \[1, 25\]"),
        ({"ramp": (2, 26)}, r"ramp\[1\] must be in \[1, 25\]"),
        ({"ramp": "24"}, "ramp must be a tuple of ints"),
        ({"ramp": 4}, "ramp must be a tuple of ints"),
        ({"max_frames": 0}, r"max_frames must be in \[1, 8192\]"),
        ({"max_frames": 80}, r"left_context_frames \+ largest chunk = 97 frames exceeds max_frames=80"),
        ({"max_frames": 64}, r"left_context_frames must be in \[0, 64\], got 72"),
        ({"samples_per_frame": 0}, "samples_per_frame must be in"),
    ],
)
def test_config_validation_messages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ScheduleConfig(**kwargs)


def test_config_accepts_list_ramp_and_bounds():
    cfg = ScheduleConfig(first_chunk_frames=1, ramp=[1, 3], chunk_frames=3, left_context_frames=0, max_frames=3)
    assert cfg.ramp == (1, 3) and cfg.max_window_frames == 3
    with pytest.raises(ValueError, match="chunk index"):
        cfg.chunk_size(-1)


def test_plan_chunks_checks_arrivals():
    with pytest.raises(ValueError, match="arrivals sum to 3"):
        plan_chunks(4, arrivals=[1, 2])


# --- whole-utterance equivalence ------------------------------------------------------------

SPF = 5  # samples per frame of the fake decoder


def _fake_causal_decode(receptive: int):
    """A causal 'decoder' whose frame t depends on frames [t - receptive, t] of its window
    (frames before the window count as absent), like a conv stack with a finite receptive field."""

    def decode(window: np.ndarray) -> np.ndarray:
        out = np.zeros((len(window), SPF))
        for t in range(len(window)):
            lo = max(0, t - receptive)
            w = window[lo : t + 1]
            out[t] = np.sin(np.arange(SPF) + (w * np.arange(1, len(w) + 1)[::-1, None]).sum())
        return out.reshape(-1)

    return decode


@pytest.mark.parametrize("seed", range(5))
def test_stream_decode_equals_whole_decode_when_context_covers_receptive_field(seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 50, size=(int(rng.integers(1, 120)), 16))
    decode = _fake_causal_decode(receptive=10)
    cfg = ScheduleConfig(left_context_frames=10, samples_per_frame=SPF)
    pieces = stream_decode(codes, decode, cfg, arrivals=_random_arrivals(random.Random(seed), len(codes)))
    np.testing.assert_array_equal(np.concatenate(pieces), decode(codes))


def test_stream_decode_differs_when_context_is_too_short():
    codes = np.random.default_rng(0).integers(0, 50, size=(80, 16))
    decode = _fake_causal_decode(receptive=10)
    cfg = ScheduleConfig(left_context_frames=3, samples_per_frame=SPF)
    assert not np.allclose(np.concatenate(stream_decode(codes, decode, cfg)), decode(codes))


def test_stream_decode_checks_decoder_output_length():
    cfg = ScheduleConfig(samples_per_frame=SPF)
    with pytest.raises(ValueError, match="decode returned 1 samples for 2 frames, expected 10"):
        stream_decode(np.zeros((4, 16)), lambda w: np.zeros(1), cfg)


def test_stream_decode_with_the_tiny_codec_decoder_matches_whole_decode():
    """With left context covering the whole prefix, stateless chunked decoding of the package's
    causal codec equals a whole-utterance decode up to float noise."""
    torch = pytest.importorskip("torch")
    codec = importlib.import_module("triton_qwen3_tts.model.codec")
    from triton_qwen3_tts.model.config import SpeechTokenizerConfig
    from triton_qwen3_tts.model.presets import speech_tokenizer_config

    cfg = SpeechTokenizerConfig.from_dict(speech_tokenizer_config("tiny")).decoder
    dec = codec.CodecDecoder(cfg).eval()
    codec.init_random_codec_weights(dec, seed=0)
    spf = cfg.total_upsample
    t = 40
    codes = torch.randint(0, cfg.codebook_size, (t, 16), generator=torch.Generator().manual_seed(0))

    def decode(window):
        with torch.inference_mode():
            return dec.decode(window[None])[0].numpy()

    whole = decode(codes)
    sched = ScheduleConfig(left_context_frames=t, samples_per_frame=spf)
    streamed = np.concatenate(stream_decode(codes, decode, sched))
    assert streamed.shape == whole.shape == (t * spf,)
    assert np.abs(streamed - whole).max() < 1e-4
