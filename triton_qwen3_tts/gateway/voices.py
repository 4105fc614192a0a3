"""The gateway's voice store: cloned voices (Base checkpoints) kept on disk across restarts.

Layout (``--voices-dir``, default ``$QWEN3_TTS_CACHE/voices``): one folder per voice,
``<dir>/<voice id>/audio.wav`` (the reference clip, mono float32 WAV at its own rate) and
``<dir>/<voice id>/meta.json`` (``id``, ``ref_text``, ``sample_rate``, ``seconds``,
``fingerprint``, ``created``). A voice is written into a temporary folder (``.tmp-*``) and renamed
into place: a folder rename is atomic and fails when the target exists, so two gateways (or two
requests) registering one id cannot both win: the second gets :class:`VoiceExists` (HTTP 409)
unless it asks to overwrite. Folders left by an interrupted write (``.tmp-*``, ``.trash-*``) are
removed on load. The store is loaded when the gateway starts.

Each voice is sent to the `tts` model with the reference clip and a ``voice_id`` derived from the
voice id and the clip's fingerprint (:attr:`StoredVoice.cache_id`), so the tts's in-memory voice
cache answers repeats (no encoder runs) and a replaced voice never meets its old cache entry.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np

from triton_qwen3_tts.gateway.errors import ApiError, bad_request

__all__ = ["StoredVoice", "VoiceStore", "VoiceExists", "decode_clip", "VOICE_ID", "REF_RATES"]

VOICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# the tts model's accepted reference rates (serving/tts/request.py TtsLimits.ref_sample_rates)
REF_RATES = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0
MAX_UPLOAD_BYTES = 64 * 2**20
MAX_REF_TEXT_CHARS = 2000


class VoiceExists(ApiError):
    def __init__(self, voice_id: str):
        super().__init__(
            409, f"voice: {voice_id!r} already exists; DELETE it first or send overwrite=true", "voice", "voice_exists"
        )


def fingerprint(audio: np.ndarray, rate: int) -> str:
    """BLAKE2b-128 of the rate and the float32 samples (the tts model's voice fingerprint)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(int(rate).to_bytes(4, "little"))
    h.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class StoredVoice:
    id: str
    audio: np.ndarray  # float32 mono
    sample_rate: int
    ref_text: Optional[str]
    fingerprint: str
    created: float

    @property
    def cache_id(self) -> str:
        return f"gateway/{self.id}/{self.fingerprint[:16]}"

    @property
    def seconds(self) -> float:
        return self.audio.shape[0] / self.sample_rate

    def describe(self) -> dict:
        return {
            "id": self.id,
            "object": "voice",
            "type": "stored",
            "ref_text": self.ref_text,
            "sample_rate": self.sample_rate,
            "seconds": round(self.seconds, 3),
            "created_at": int(self.created),
        }


def decode_clip(data: bytes, param: str = "file") -> tuple:
    """``(float32 mono samples, rate)`` of an uploaded clip: libsndfile (WAV, FLAC, Ogg) first, then
    PyAV (mp3, m4a, ...). Channels are averaged; a rate the tts does not take is resampled to
    24 kHz. Raises ApiError(400) naming ``param``."""
    if not data:
        raise bad_request(param, "is empty")
    if len(data) > MAX_UPLOAD_BYTES:
        raise bad_request(param, f"is {len(data)} bytes; at most {MAX_UPLOAD_BYTES} are accepted")
    audio = rate = None
    try:
        import soundfile as sf

        x, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        audio = x.mean(axis=1)
    except Exception:  # noqa: BLE001 - not a libsndfile format: try FFmpeg
        try:
            import av

            with av.open(io.BytesIO(data)) as c:
                stream = c.streams.audio[0]
                rate = stream.rate
                # FFmpeg's resampler mixes the channels down and converts to float at the clip's rate
                mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
                parts = [f.to_ndarray().reshape(-1) for frame in c.decode(stream) for f in mono.resample(frame)]
                parts += [f.to_ndarray().reshape(-1) for f in mono.resample(None)]
            if not parts:
                raise ValueError("no audio frames")
            audio = np.concatenate(parts)
        except Exception as e:  # noqa: BLE001
            raise bad_request(param, f"cannot be decoded as audio ({type(e).__name__}: {e})") from None
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if not np.all(np.isfinite(audio)):
        raise bad_request(param, "contains NaN or Inf samples")
    if rate not in REF_RATES:
        import soxr

        audio, rate = soxr.resample(audio, rate, 24000).astype(np.float32), 24000
    secs = audio.shape[0] / rate
    if not MIN_SECONDS <= secs <= MAX_SECONDS:
        raise bad_request(param, f"is {secs:.2f} s long; a reference clip must be {MIN_SECONDS:g}-{MAX_SECONDS:g} s")
    peak = float(np.max(np.abs(audio)))
    if peak > 1.0:
        audio = audio / peak
    if float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) < 1e-4:
        raise bad_request(param, "is silence")
    return audio, int(rate)


def check_voice_id(voice_id: str) -> str:
    if not isinstance(voice_id, str) or not VOICE_ID.match(voice_id):
        raise bad_request(
            "id", f"{voice_id!r} is not a valid voice id: 1-64 characters of letters, digits, '_', '.', '-'"
        )
    return voice_id


class VoiceStore:
    """Voices on disk under ``root`` (see the module docstring), mirrored in memory."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()
        self._voices: Dict[str, StoredVoice] = {}
        self.skipped: List[str] = []  # folders that could not be loaded (with why)
        self.load()

    def load(self) -> None:
        import soundfile as sf

        voices = {}
        for name in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, name)
            if name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not os.path.isdir(path) or not VOICE_ID.match(name):
                continue
            try:
                with open(os.path.join(path, "meta.json"), encoding="utf-8") as f:
                    meta = json.load(f)
                audio, rate = sf.read(os.path.join(path, "audio.wav"), dtype="float32")
                fp = fingerprint(audio, rate)
                if meta.get("fingerprint") != fp or int(meta.get("sample_rate")) != rate:
                    raise ValueError("audio.wav does not match meta.json")
                voices[name] = StoredVoice(name, audio, rate, meta.get("ref_text"), fp, float(meta.get("created", 0)))
            except Exception as e:  # noqa: BLE001 - one broken voice must not stop the gateway
                self.skipped.append(f"{name}: {type(e).__name__}: {e}")
        with self._lock:
            self._voices = voices

    def __contains__(self, voice_id: str) -> bool:
        return voice_id in self._voices

    def get(self, voice_id: str) -> Optional[StoredVoice]:
        return self._voices.get(voice_id)

    def list(self) -> List[StoredVoice]:
        with self._lock:
            return sorted(self._voices.values(), key=lambda v: v.created)

    def add(
        self,
        audio: np.ndarray,
        rate: int,
        ref_text: Optional[str],
        voice_id: Optional[str] = None,
        overwrite: bool = False,
    ) -> StoredVoice:
        """Store a voice; ``voice_id`` None picks a fresh one. An existing id raises
        :class:`VoiceExists` unless ``overwrite``."""
        import soundfile as sf

        if ref_text is not None:
            ref_text = ref_text.strip() or None
            if ref_text and len(ref_text) > MAX_REF_TEXT_CHARS:
                raise bad_request("ref_text", f"has {len(ref_text)} characters; the limit is {MAX_REF_TEXT_CHARS}")
        vid = check_voice_id(voice_id) if voice_id is not None else f"voice_{uuid.uuid4().hex[:12]}"
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        voice = StoredVoice(vid, audio, int(rate), ref_text, fingerprint(audio, rate), time.time())
        tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
        os.makedirs(tmp)
        try:
            sf.write(os.path.join(tmp, "audio.wav"), audio, rate, subtype="FLOAT")
            meta = {k: v for k, v in voice.describe().items() if k not in ("object", "type")}
            meta.update(fingerprint=voice.fingerprint, created=voice.created)
            with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            dst = os.path.join(self.root, vid)
            with self._lock:
                if os.path.exists(dst):
                    if not overwrite:
                        raise VoiceExists(vid)
                    trash = os.path.join(self.root, f".trash-{uuid.uuid4().hex}")
                    os.rename(dst, trash)
                    os.rename(tmp, dst)
                    shutil.rmtree(trash, ignore_errors=True)
                else:
                    try:
                        os.rename(tmp, dst)  # fails if another process created it meanwhile
                    except OSError:
                        raise VoiceExists(vid) from None
                self._voices[vid] = voice
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return voice

    def delete(self, voice_id: str) -> bool:
        """Remove a voice; False when there is none by that id."""
        if not VOICE_ID.match(voice_id or ""):
            return False
        with self._lock:
            dst = os.path.join(self.root, voice_id)
            if voice_id not in self._voices and not os.path.isdir(dst):
                return False
            if os.path.isdir(dst):
                trash = os.path.join(self.root, f".trash-{uuid.uuid4().hex}")
                os.rename(dst, trash)
                shutil.rmtree(trash, ignore_errors=True)
            self._voices.pop(voice_id, None)
            return True
