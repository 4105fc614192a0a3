"""Audio front end for Base (voice-clone) prompts: validation, resampling and the mel spectrogram.

Follows the official speaker encoder's mel front end and the official wrapper's audio handling
(https://github.com/QwenLM/Qwen3-TTS):

- Reference audio is mono float32 at 24 kHz before it reaches the speaker encoder or the
  speech-tokenizer encoder. The official package resamples with ``librosa.resample``, whose
  default method is soxr "HQ" followed by ``fix_length`` to ``ceil(n * target / orig)``
  samples; :func:`resample` does the same without librosa.
- The mel spectrogram is the official ``mel_spectrogram`` with the arguments that
  ``extract_speaker_embedding`` passes (n_fft 1024, Hann window 1024, hop 256, 128 Slaney mels
  0..12000 Hz, reflect pad 384 per side, ``center=False``, magnitude ``sqrt(re²+im²+1e-9)``,
  ``log(clamp(x, 1e-5))``). Our output is ``[B, frames, 128]`` (the layout the speaker
  encoder takes); the official function returns ``[B, 128, frames]`` and the caller transposes.

The filterbank is librosa's ``filters.mel`` with its defaults (``htk=False`` → Slaney mel
scale, ``norm="slaney"`` → area normalisation). librosa is not a dependency; transformers'
``mel_filter_bank(norm="slaney", mel_scale="slaney")`` builds the same matrix (same FFT bin
frequencies ``linspace(0, sr/2, n_fft/2+1)``, same mel points, same triangle slopes and the
same ``2 / (f[i+2] - f[i])`` normalisation); ``tests/test_audio.py`` checks it against an
independent closed-form implementation.

Imports neither vLLM nor Triton.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Union

import numpy as np
import torch

__all__ = [
    "AudioError",
    "SAMPLE_RATE",
    "N_FFT",
    "HOP_LENGTH",
    "WIN_LENGTH",
    "N_MELS",
    "FMIN",
    "FMAX",
    "MIN_SAMPLE_RATE",
    "MAX_SAMPLE_RATE",
    "DEFAULT_SILENCE_RMS",
    "mel_filterbank",
    "hann_window",
    "mel_spectrogram",
    "num_mel_frames",
    "resample",
    "validate_reference_audio",
    "prepare_reference_audio",
    "as_waveform_tensor",
]

SAMPLE_RATE = 24000  # model rate of the speaker encoder and the speech tokenizer
N_FFT = 1024
WIN_LENGTH = 1024
HOP_LENGTH = 256
N_MELS = 128
FMIN = 0.0
FMAX = 12000.0
LOG_CLAMP = 1e-5  # log(clamp(mel, 1e-5)), official dynamic_range_compression
MAG_EPS = 1e-9  # sqrt(re² + im² + 1e-9)
_PAD = (N_FFT - HOP_LENGTH) // 2  # 384 reflect-padded samples on each side

MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
# RMS below this (about -80 dBFS) counts as silence: the x-vector of digital silence is
# meaningless and the mel is log(1e-5) everywhere.
DEFAULT_SILENCE_RMS = 1e-4

_ACCEPTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int16))


class AudioError(ValueError):
    """Reference audio that cannot be used; ``field`` names the request field at fault.

    A ``ValueError`` subclass so that callers that only know ``ValueError`` still map it to a
    client error (HTTP 400 / Triton INVALID_ARG).
    """

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# ----------------------------------------------------------------------------------------------
# Mel spectrogram


@functools.lru_cache(maxsize=1)
def _mel_filterbank_np() -> np.ndarray:
    """[128, 513] float32 Slaney filterbank (librosa ``filters.mel(sr=24000, n_fft=1024,
    n_mels=128, fmin=0, fmax=12000)``)."""
    from transformers.audio_utils import mel_filter_bank

    fb = mel_filter_bank(
        num_frequency_bins=N_FFT // 2 + 1,
        num_mel_filters=N_MELS,
        min_frequency=FMIN,
        max_frequency=FMAX,
        sampling_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )  # [n_freq, n_mels], float64
    out = np.ascontiguousarray(fb.T.astype(np.float32))  # librosa returns float32 [n_mels, n_freq]
    out.setflags(write=False)
    return out


# Bounded caches keyed on (device, dtype): a server touches one or two devices and dtypes.
@functools.lru_cache(maxsize=8)
def mel_filterbank(device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``[128, 513]`` mel filterbank on ``device`` in ``dtype`` (cached; do not modify)."""
    return torch.from_numpy(_mel_filterbank_np().copy()).to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=8)
def hann_window(device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Periodic Hann window of 1024 samples (``torch.hann_window`` default), cached."""
    return torch.hann_window(WIN_LENGTH, dtype=dtype).to(device)


def num_mel_frames(num_samples: int) -> int:
    """Frames produced by :func:`mel_spectrogram` for ``num_samples`` samples (``samples // 256``)."""
    padded = num_samples + 2 * _PAD
    if padded < N_FFT:
        return 0
    return 1 + (padded - N_FFT) // HOP_LENGTH


def mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """Log-mel spectrogram of 24 kHz audio: ``[B, samples]`` → ``[B, frames, 128]``.

    Computed in float64 when ``wav`` is float64, otherwise in float32 (the official path feeds
    float32 audio and a float32 filterbank); the caller casts to the model dtype afterwards.
    ``frames == samples // 256``. Needs more than 384 samples (reflect padding).
    """
    if not isinstance(wav, torch.Tensor):
        raise TypeError(f"mel_spectrogram expects a torch.Tensor, got {type(wav).__name__}")
    if wav.dim() != 2:
        raise ValueError(f"mel_spectrogram expects [batch, samples], got shape {tuple(wav.shape)}")
    if wav.shape[-1] <= _PAD:
        raise ValueError(f"mel_spectrogram needs more than {_PAD} samples, got {wav.shape[-1]}")
    dtype = torch.float64 if wav.dtype == torch.float64 else torch.float32
    y = wav.to(dtype)
    # Reflect padding as in the official code: pad (n_fft - hop) / 2 on each side, then an
    # uncentred STFT, so that frame t covers samples [256 t - 384, 256 t + 640).
    y = torch.nn.functional.pad(y.unsqueeze(1), (_PAD, _PAD), mode="reflect").squeeze(1)
    spec = torch.stft(
        y,
        N_FFT,
        hop_length=HOP_LENGTH,
        win_length=WIN_LENGTH,
        window=hann_window(y.device, dtype),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )  # [B, 513, frames]
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MAG_EPS)
    mel = torch.matmul(mel_filterbank(y.device, dtype), mag)  # [B, 128, frames]
    mel = torch.log(torch.clamp(mel, min=LOG_CLAMP))
    return mel.transpose(1, 2)


# ----------------------------------------------------------------------------------------------
# Resampling and validation


def _check_sample_rate(sr, field: str = "sample_rate") -> int:
    if isinstance(sr, bool) or not isinstance(sr, (int, np.integer)):
        if isinstance(sr, float) and float(sr).is_integer():
            sr = int(sr)
        else:
            raise AudioError(field, f"must be an integer number of Hz, got {sr!r}")
    sr = int(sr)
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise AudioError(field, f"{sr} Hz is outside the supported range {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
    return sr


def resample(wav: np.ndarray, orig_sr: int, target_sr: int = SAMPLE_RATE) -> np.ndarray:
    """Resample mono audio with soxr "HQ", as ``librosa.resample`` (default ``soxr_hq``) does.

    Returns float32 of exactly ``ceil(len * target_sr / orig_sr)`` samples (librosa's
    ``fix_length``: zero-pad or trim the soxr output). Returns a float32 copy unchanged when the
    rates are equal. Accepts 1-D float32/float64 arrays only; use
    :func:`validate_reference_audio` first for user input.
    """
    orig_sr = _check_sample_rate(orig_sr, "sample_rate")
    target_sr = _check_sample_rate(target_sr, "target_sample_rate")
    if not isinstance(wav, np.ndarray):
        raise AudioError("audio", f"expected a numpy array, got {type(wav).__name__}")
    if wav.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise AudioError("audio", f"resample expects float32/float64 samples, got {wav.dtype}")
    if wav.ndim != 1:
        raise AudioError("audio", f"resample expects mono audio of shape [samples], got {wav.shape}")
    if orig_sr == target_sr:
        return wav.astype(np.float32, copy=True)
    import soxr

    n_out = int(math.ceil(wav.shape[0] * target_sr / orig_sr))
    y = soxr.resample(np.ascontiguousarray(wav), orig_sr, target_sr, quality="HQ")
    y = np.asarray(y, dtype=np.float32)
    if y.shape[0] > n_out:
        y = y[:n_out]
    elif y.shape[0] < n_out:
        y = np.pad(y, (0, n_out - y.shape[0]))
    return np.ascontiguousarray(y)


def validate_reference_audio(
    wav,
    sr,
    min_seconds: float,
    max_seconds: float,
    *,
    silence_rms: float = DEFAULT_SILENCE_RMS,
    field: str = "ref_audio",
) -> np.ndarray:
    """Check user reference audio and return it as mono float32 ``[samples]`` (not resampled).

    Raises :class:`AudioError` for: a non-array, a dtype other than float32/float64/int16
    (int16 is scaled by 1/32768), a shape other than ``[samples]`` or ``[1, samples]`` (mono
    only: we do not guess how to mix channels), a bad sample rate, NaN/Inf, a duration outside
    ``[min_seconds, max_seconds]``, and silence (RMS below ``silence_rms``).
    """
    sr = _check_sample_rate(sr, "sample_rate")
    if not isinstance(wav, np.ndarray):
        raise AudioError(field, f"expected a numpy array of samples, got {type(wav).__name__}")
    if wav.dtype not in _ACCEPTED_DTYPES:
        raise AudioError(field, f"unsupported sample dtype {wav.dtype}; use float32, float64 or int16")
    if wav.ndim == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.ndim != 1:
        raise AudioError(
            field, f"audio must be mono with shape [samples] or [1, samples], got shape {tuple(wav.shape)}"
        )
    if wav.dtype == np.int16:
        out = wav.astype(np.float32) / 32768.0
    else:
        if not np.isfinite(wav).all():
            raise AudioError(field, "audio contains NaN or Inf samples")
        out = wav.astype(np.float32)
        if not np.isfinite(out).all():  # float64 values beyond the float32 range
            raise AudioError(field, "audio contains samples too large for float32")
    seconds = out.shape[0] / sr
    if seconds < min_seconds:
        raise AudioError(field, f"audio is too short: {seconds:.3f} s, need at least {min_seconds} s")
    if seconds > max_seconds:
        raise AudioError(field, f"audio is too long: {seconds:.3f} s, the limit is {max_seconds} s")
    rms = float(np.sqrt(np.mean(np.square(out, dtype=np.float64))))
    if rms < silence_rms:
        raise AudioError(field, f"audio is silent (RMS {rms:.2e} < {silence_rms:.0e})")
    return np.ascontiguousarray(out)


def prepare_reference_audio(
    wav,
    sr,
    min_seconds: float,
    max_seconds: float,
    *,
    silence_rms: float = DEFAULT_SILENCE_RMS,
    field: str = "ref_audio",
    target_sr: int = SAMPLE_RATE,
) -> np.ndarray:
    """:func:`validate_reference_audio` then :func:`resample` to 24 kHz: mono float32 ``[samples]``."""
    out = validate_reference_audio(wav, sr, min_seconds, max_seconds, silence_rms=silence_rms, field=field)
    return resample(out, int(sr), target_sr)


def as_waveform_tensor(wav: Union[np.ndarray, torch.Tensor], device: Optional[torch.device] = None) -> torch.Tensor:
    """A 1-D float waveform (numpy or torch) as a float32/float64 torch tensor ``[samples]``."""
    t = torch.from_numpy(np.ascontiguousarray(wav)) if isinstance(wav, np.ndarray) else wav
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a numpy array or torch tensor, got {type(wav).__name__}")
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise ValueError(f"expected a mono waveform [samples], got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        raise ValueError(f"expected float samples, got {t.dtype}")
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t if device is None else t.to(device)
