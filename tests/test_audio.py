"""Tests for triton_qwen3_tts.model.audio: Slaney filterbank, log-mel, resampling, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from triton_qwen3_tts.model import audio
from triton_qwen3_tts.model.audio import (
    AudioError,
    hann_window,
    mel_filterbank,
    mel_spectrogram,
    num_mel_frames,
    prepare_reference_audio,
    resample,
    validate_reference_audio,
)

SR = 24000


# ---------------------------------------------------------------- independent references


def _slaney_hz_to_mel(f):
    """librosa ``hz_to_mel(htk=False)``, written from the closed form: linear below 1 kHz
    (200/3 Hz per mel), logarithmic above (27 mels per factor 6.4)."""
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def _slaney_mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), m * f_sp)


def _reference_filterbank(sr=SR, n_fft=1024, n_mels=128, fmin=0.0, fmax=12000.0):
    """librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) (Slaney scale + norm), one filter at a time."""
    fftfreqs = np.arange(n_fft // 2 + 1) * (sr / n_fft)
    mel_f = _slaney_mel_to_hz(np.linspace(_slaney_hz_to_mel(fmin), _slaney_hz_to_mel(fmax), n_mels + 2))
    w = np.zeros((n_mels, len(fftfreqs)))
    for i in range(n_mels):
        lo, c, hi = mel_f[i], mel_f[i + 1], mel_f[i + 2]
        rising = (fftfreqs - lo) / (c - lo)
        falling = (hi - fftfreqs) / (hi - c)
        w[i] = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (hi - lo))
    return w, mel_f


def _numpy_logmel(wav: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """Independent numpy log-mel: reflect pad 384, frames of 1024 every 256, periodic Hann, rfft."""
    y = np.pad(wav.astype(np.float64), (384, 384), mode="reflect")
    n = 1 + (len(y) - 1024) // 256
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1024) / 1024)
    frames = np.stack([y[t * 256 : t * 256 + 1024] * win for t in range(n)])  # [n, 1024]
    spec = np.fft.rfft(frames, axis=-1)  # [n, 513]
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    return np.log(np.maximum(mag @ fb.T, 1e-5))  # [n, 128]


# ---------------------------------------------------------------- filterbank


def test_slaney_reference_known_values():
    # Fixed points of the Slaney scale (librosa docs): 1 kHz = 15 mel; linear part 200/3 Hz/mel.
    assert _slaney_hz_to_mel(1000.0) == pytest.approx(15.0)
    assert _slaney_hz_to_mel(200.0 / 3) == pytest.approx(1.0)
    assert _slaney_hz_to_mel(6400.0) == pytest.approx(15.0 + 27.0)
    assert _slaney_mel_to_hz(_slaney_hz_to_mel(12000.0)) == pytest.approx(12000.0)


def test_filterbank_matches_closed_form_slaney():
    fb = mel_filterbank().numpy()
    ref, mel_f = _reference_filterbank()
    assert fb.shape == (128, 513) and fb.dtype == np.float32
    np.testing.assert_allclose(fb, ref, rtol=1e-5, atol=1e-9)
    # Slaney area normalisation: each triangle has unit area in Hz, so for filters that span
    # many FFT bins the discrete sum * bin width is close to 1.
    df = SR / 1024
    widths = (mel_f[2:] - mel_f[:-2]) / df
    areas = fb.sum(axis=1) * df
    wide = widths > 6
    assert wide.sum() >= 50
    np.testing.assert_allclose(areas[wide], 1.0, rtol=0.02)
    np.testing.assert_allclose(areas, 1.0, rtol=0.1)  # narrow low filters: coarse sampling
    # Peak of each filter sits at its centre frequency.
    centres = mel_f[1:-1]
    peak_hz = fb.argmax(axis=1) * df
    assert np.all(np.abs(peak_hz - centres) <= df)
    # No filter reaches beyond fmax.
    assert np.all(fb[:, np.arange(513) * df > 12000.0 + 1e-6] == 0)


def test_filterbank_and_window_are_cached_per_device_dtype():
    a = mel_filterbank(torch.device("cpu"), torch.float32)
    assert mel_filterbank(torch.device("cpu"), torch.float32) is a
    b = mel_filterbank(torch.device("cpu"), torch.float64)
    assert b is not a and b.dtype == torch.float64
    assert hann_window(torch.device("cpu"), torch.float32) is hann_window(torch.device("cpu"), torch.float32)
    w = hann_window(torch.device("cpu"), torch.float64).numpy()
    np.testing.assert_allclose(w, 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(1024) / 1024), atol=1e-12)
    assert mel_filterbank.cache_info().maxsize is not None  # bounded


# ---------------------------------------------------------------- mel spectrogram


@pytest.mark.parametrize("n", [385, 1000, 24000, 24000 * 2 + 333])
def test_mel_matches_numpy_reference(n):
    rng = np.random.default_rng(n)
    wav = (rng.standard_normal(n) * 0.2).astype(np.float64)
    fb = mel_filterbank(torch.device("cpu"), torch.float64).numpy()
    ref = _numpy_logmel(wav, fb)
    got64 = mel_spectrogram(torch.from_numpy(wav)[None])[0].numpy()
    assert got64.shape == ref.shape == (n // 256, 128) == (num_mel_frames(n), 128)
    np.testing.assert_allclose(got64, ref, atol=1e-8)
    got32 = mel_spectrogram(torch.from_numpy(wav.astype(np.float32))[None])[0]
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), ref, atol=2e-3)


def test_mel_batch_rows_independent_and_sine_peak():
    t = np.arange(SR) / SR
    a = 0.5 * np.sin(2 * np.pi * 3000.0 * t)
    b = 0.5 * np.sin(2 * np.pi * 500.0 * t)
    mels = mel_spectrogram(torch.tensor(np.stack([a, b]), dtype=torch.float32))
    assert mels.shape == (2, SR // 256, 128)
    single = mel_spectrogram(torch.tensor(b, dtype=torch.float32)[None])
    torch.testing.assert_close(mels[1:], single)
    _, mel_f = _reference_filterbank()
    centres = mel_f[1:-1]
    for row, hz in ((0, 3000.0), (1, 500.0)):
        k = int(mels[row, 10:-10].mean(0).argmax())
        # The winning filter's band contains the tone.
        assert mel_f[k] <= hz <= mel_f[k + 2], (hz, centres[k])
    # Silence hits the log clamp: log(sqrt(1e-9) * filter sum) is far below 0, but finite.
    z = mel_spectrogram(torch.zeros(1, 4096))
    assert torch.isfinite(z).all() and float(z.max()) < -5


def test_mel_rejects_bad_input():
    with pytest.raises(ValueError, match="more than 384"):
        mel_spectrogram(torch.zeros(1, 384))
    with pytest.raises(ValueError, match="batch, samples"):
        mel_spectrogram(torch.zeros(4096))
    with pytest.raises(TypeError):
        mel_spectrogram(np.zeros((1, 4096), dtype=np.float32))


# ---------------------------------------------------------------- resampling


@pytest.mark.parametrize("sr", [8000, 16000, 22050, 44100, 48000])
def test_resample_length_and_content(sr):
    n = sr * 1 + 17
    t = np.arange(n) / sr
    wav = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    out = resample(wav, sr)
    assert out.dtype == np.float32 and out.ndim == 1
    assert len(out) == math.ceil(n * SR / sr)
    spec = np.abs(np.fft.rfft(out[:SR]))
    peak_hz = spec.argmax() * SR / SR  # 1 s window -> 1 Hz bins
    assert abs(peak_hz - 440.0) <= 1.0
    # Amplitude is preserved away from the edges.
    assert np.max(np.abs(out[1000:-1000])) == pytest.approx(0.5, abs=0.02)


def test_resample_identity_and_errors():
    wav = np.linspace(-1, 1, 1000, dtype=np.float64)
    out = resample(wav, SR)
    assert out.dtype == np.float32 and np.array_equal(out, wav.astype(np.float32))
    with pytest.raises(AudioError) as e:
        resample(wav, 4000)
    assert e.value.field == "sample_rate"
    with pytest.raises(AudioError):
        resample(wav, 400000)
    with pytest.raises(AudioError):
        resample(wav, 16000.5)
    with pytest.raises(AudioError):
        resample(wav.astype(np.int16), 16000)
    with pytest.raises(AudioError):
        resample(np.stack([wav, wav]), 16000)


# ---------------------------------------------------------------- validation


def _tone(seconds=2.0, sr=16000, dtype=np.float32, amp=0.3):
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * 220.0 * t)).astype(dtype)


def test_validate_accepts_and_normalises():
    w = _tone()
    out = validate_reference_audio(w, 16000, 1.0, 30.0)
    assert out.dtype == np.float32 and out.shape == w.shape
    np.testing.assert_array_equal(out, w)
    out = validate_reference_audio(_tone(dtype=np.float64)[None], 16000, 1.0, 30.0)  # [1, samples]
    assert out.shape == (32000,) and out.dtype == np.float32
    i16 = (_tone() * 32767).astype(np.int16)
    out = validate_reference_audio(i16, 16000, 1.0, 30.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, i16 / 32768.0, atol=1e-7)
    assert np.abs(out).max() <= 1.0
    prepared = prepare_reference_audio(w, 16000, 1.0, 30.0)
    assert prepared.dtype == np.float32 and len(prepared) == 48000


@pytest.mark.parametrize(
    "case,match",
    [
        ("nan", "NaN or Inf"),
        ("inf", "NaN or Inf"),
        ("silent", "silent"),
        ("short", "too short"),
        ("long", "too long"),
        ("float16", "dtype"),
        ("int32", "dtype"),
        ("stereo", "mono"),
        ("stereo_last", "mono"),
        ("3d", "mono"),
        ("list", "numpy array"),
        ("empty", "too short"),
    ],
)
def test_validate_errors(case, match):
    w = _tone()
    sr = 16000
    if case == "nan":
        w[100] = np.nan
    elif case == "inf":
        w[5] = np.inf
    elif case == "silent":
        w = np.zeros_like(w) + 1e-6
    elif case == "short":
        w = w[:8000]
    elif case == "long":
        w = _tone(seconds=31.0)
    elif case == "float16":
        w = w.astype(np.float16)
    elif case == "int32":
        w = (w * 1e6).astype(np.int32)
    elif case == "stereo":
        w = np.stack([w, w])
    elif case == "stereo_last":
        w = np.stack([w, w], axis=-1)
    elif case == "3d":
        w = w[None, None]
    elif case == "list":
        w = w.tolist()
    elif case == "empty":
        w = w[:0]
    with pytest.raises(AudioError, match=match) as e:
        validate_reference_audio(w, sr, 1.0, 30.0)
    assert isinstance(e.value, ValueError)
    assert e.value.field == "ref_audio"
    assert str(e.value).startswith("ref_audio: ")


@pytest.mark.parametrize("sr", [0, 7999, 192001, "24000", None, True])
def test_validate_bad_sample_rate(sr):
    with pytest.raises(AudioError) as e:
        validate_reference_audio(_tone(), sr, 1.0, 30.0)
    assert e.value.field == "sample_rate"


def test_validate_custom_field_and_threshold():
    quiet = _tone(amp=1e-3)  # RMS ~7e-4
    validate_reference_audio(quiet, 16000, 1.0, 30.0)
    with pytest.raises(AudioError, match="silent") as e:
        validate_reference_audio(quiet, 16000, 1.0, 30.0, silence_rms=1e-2, field="voice")
    assert e.value.field == "voice"
    assert audio.DEFAULT_SILENCE_RMS > 0
