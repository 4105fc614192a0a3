"""Resampling and streaming encoders for the gateway's ``response_format`` values.

Every encoder takes float32 mono chunks as they arrive and returns the bytes ready to send at once
(:meth:`Encoder.encode`), then the tail (:meth:`Encoder.finish`): a client receives audio with the
first chunk, not after the whole utterance.

* ``pcm``: raw 16-bit signed little-endian samples (as OpenAI's ``pcm``).
* ``wav``: a RIFF header whose RIFF and data sizes are 0xFFFFFFFF (the length is not known when the
  header goes out; libsndfile, FFmpeg and browsers read such a file to its end), then 16-bit PCM.
  Written here because libsndfile writes the sizes when the file is closed and so needs a seekable
  output; the 44-byte header is fixed by the RIFF/WAVE format.
* ``mp3`` (libmp3lame), ``opus`` (libopus in Ogg; pages flushed every 20 ms), ``aac`` (FFmpeg's
  AAC in ADTS), ``flac`` (FFmpeg's FLAC): PyAV (``av``), FFmpeg's encoders and muxers writing
  into a sink that is drained after every chunk. Available where ``av`` is installed with those
  encoders (:func:`supported_formats`).

Rates: the `tts` model produces 24 kHz; :class:`Resampler` (soxr's streaming resampler, the tts
model's ``StreamResampler``) converts to the requested ``sample_rate``. mp3, opus and aac accept only their codecs' rates
(:func:`allowed_rates`). Ogg Opus decoders output 48 kHz whatever the input rate was (RFC 7845).
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Dict, Optional, Tuple

import numpy as np

from triton_qwen3_tts.serving.tts.pipeline import StreamResampler

__all__ = [
    "FORMATS",
    "CONTENT_TYPES",
    "MIN_RATE",
    "MAX_RATE",
    "Encoder",
    "Resampler",
    "allowed_rates",
    "make_encoder",
    "supported_formats",
]

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's order; mp3 is its default
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
MIN_RATE, MAX_RATE = 8000, 48000
# response_format -> (FFmpeg encoder, muxer, muxer options)
_AV = {
    "mp3": ("libmp3lame", "mp3", {}),
    "opus": ("libopus", "ogg", {"page_duration": "20000"}),
    "aac": ("aac", "adts", {}),
    "flac": ("flac", "flac", {}),
}


@lru_cache(maxsize=None)
def _av_rates(fmt: str) -> Optional[Tuple[int, ...]]:
    """The encoder's sample rates (None: any), or ``()`` when PyAV or the encoder is missing."""
    try:
        import av

        codec = av.codec.Codec(_AV[fmt][0], "w")
    except Exception:  # noqa: BLE001 - no av, or an FFmpeg build without this encoder
        return ()
    rates = codec.audio_rates
    return tuple(sorted(r for r in rates if MIN_RATE <= r <= MAX_RATE)) if rates else None


def supported_formats() -> Tuple[str, ...]:
    """The ``response_format`` values this environment can encode."""
    return tuple(f for f in FORMATS if f not in _AV or _av_rates(f) != ())


def allowed_rates(fmt: str) -> Optional[Tuple[int, ...]]:
    """The sample rates ``fmt`` accepts within [8000, 48000]; None: every rate in that range."""
    return _av_rates(fmt) if fmt in _AV else None


def _int16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(rate: int) -> bytes:
    """A streaming WAV header (16-bit mono PCM, RIFF and data sizes 0xFFFFFFFF)."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + b"\xff" * 4
    )


class Encoder:
    """Streams float32 mono samples at ``rate`` as ``fmt`` bytes."""

    def __init__(self, fmt: str, rate: int):
        self.fmt, self.rate = fmt, rate
        self.content_type = CONTENT_TYPES[fmt]
        self._head = wav_header(rate) if fmt == "wav" else b""

    def encode(self, samples: np.ndarray) -> bytes:
        head, self._head = self._head, b""
        return head + _int16(samples)

    def finish(self) -> bytes:
        head, self._head = self._head, b""
        return head


class _Sink:
    """A write-only file for PyAV's muxer (not seekable: the muxers write a streamable form)."""

    def __init__(self):
        self.buf = bytearray()

    def write(self, b) -> int:
        self.buf += bytes(b)
        return len(b)

    def drain(self) -> bytes:
        out = bytes(self.buf)
        self.buf.clear()
        return out


class AvEncoder(Encoder):
    def __init__(self, fmt: str, rate: int):
        import av

        super().__init__(fmt, rate)
        codec, muxer, options = _AV[fmt]
        self._sink = _Sink()
        self._out = av.open(self._sink, mode="w", format=muxer, options=dict(options))
        self._stream = self._out.add_stream(codec, rate=rate, layout="mono")
        self._av = av
        self._pts = 0

    def _mux(self, frame) -> bytes:
        for packet in self._stream.encode(frame):
            self._out.mux(packet)
        return self._sink.drain()

    def encode(self, samples: np.ndarray) -> bytes:
        x = np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1)
        if x.shape[1] == 0:
            return b""
        frame = self._av.AudioFrame.from_ndarray(x, format="flt", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        self._pts += x.shape[1]
        return self._mux(frame)

    def finish(self) -> bytes:
        tail = self._mux(None)
        self._out.close()
        return tail + self._sink.drain()

    def close(self) -> None:
        """Release the encoder without finishing (the client went away)."""
        try:
            self._out.close()
        except Exception:  # noqa: BLE001 - best effort on an abandoned stream
            pass


def make_encoder(fmt: str, rate: int) -> Encoder:
    """An encoder for a validated ``fmt`` and ``rate`` (see :func:`supported_formats`)."""
    if fmt in ("wav", "pcm"):
        return Encoder(fmt, rate)
    return AvEncoder(fmt, rate)


# the tts model's streaming resampler (soxr ResampleStream, HQ): one implementation for both
Resampler = StreamResampler


def encoded_stream_parts(fmt: str, rate: int, chunks, in_rate: int = 24000) -> Dict[str, object]:
    """Encode a list of float32 chunks (a helper for tests and benchmarks): the bytes per chunk."""
    rs, enc = Resampler(in_rate, rate), make_encoder(fmt, rate)
    parts = [enc.encode(rs.process(c)) for c in chunks]
    parts.append(enc.encode(rs.process(np.zeros(0, np.float32), last=True)) + enc.finish())
    return {"parts": parts, "content_type": enc.content_type}
