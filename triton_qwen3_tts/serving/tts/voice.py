"""Base-model voice cloning in `tts`: the reference-voice cache and the choice of what to encode.

Pure logic (numpy and the standard library only; no torch, no Triton): the encoders are
supplied as one callable, so tests use fakes and the adapter the real speaker and codec encoders
(``serving/tts/encoders.py``).

A voice is what the talker's Base prompt needs from a reference: the speaker embedding
(x-vector, ``[D]`` float32), the reference codes (``[R, 16]``, in-context mode only) and the
reference transcript. :class:`VoiceCache` keeps the most recently used voices by ``voice_id``;
:func:`resolve_voice` decides, per request, whether the cache answers (no encoder runs) or the
reference audio must be encoded (and stored under the ``voice_id``, if one was given).

Rules (docs/design/serving.md, "Voice cloning"):

* ``ref_audio`` + ``voice_id``: the audio's fingerprint (BLAKE2 of sample rate and samples) is
  compared with the stored one; the same audio is a hit (encoders skipped). Other audio for an id
  in the cache is refused (``INVALID_ARG`` on ``voice_id``) unless the request sets
  ``replace_voice``, which replaces the entry. The check is made again, atomically, when the
  encoded voice is stored (:meth:`VoiceCache.store`): of two concurrent requests that register
  one id with different audio, the first to finish encoding stores its voice and the other is
  refused (with ``replace_voice`` both succeed and the last one stored stays). An id that was
  evicted is free again. A hit in in-context mode on an entry stored without codes
  (x-vector-only) is a miss: the audio is encoded again, codes included.
* ``voice_id`` alone: a hit uses the stored mode unless ``x_vector_only`` says otherwise;
  in-context mode needs stored codes. An id not in the cache is ``INVALID_ARG`` ("unknown
  voice_id"), also after its eviction.
* ``ref_text`` with ``ref_audio`` and a hit replaces the stored transcript (the codes belong to
  the audio, the transcript is the client's).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Awaitable, Callable, Optional, Tuple

import numpy as np

from triton_qwen3_tts.serving.tts.request import RequestError, TtsRequest

__all__ = [
    "Voice",
    "VoiceCache",
    "VoiceCacheStats",
    "ResolvedVoice",
    "fingerprint",
    "resolve_voice",
    "voice_conflict",
    "MAX_VOICE_CACHE_SIZE",
]

MAX_VOICE_CACHE_SIZE = 100_000


def fingerprint(audio: np.ndarray, sample_rate: int) -> str:
    """Identity of a reference: BLAKE2b-128 of the sample rate and the float32 samples."""
    h = hashlib.blake2b(digest_size=16)
    h.update(int(sample_rate).to_bytes(4, "little"))
    h.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Voice:
    speaker_embedding: np.ndarray  # float32 [D]
    ref_codes: Optional[np.ndarray]  # int32 [R, 16]; None when stored from an x-vector-only request
    ref_text: Optional[str]
    fingerprint: str

    def __post_init__(self):
        self.speaker_embedding.setflags(write=False)
        if self.ref_codes is not None:
            self.ref_codes.setflags(write=False)


@dataclass
class VoiceCacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class VoiceCache:
    """Bounded LRU of voices by ``voice_id`` (thread-safe). ``capacity`` 0 stores nothing.

    The resolver counts hits and misses (:meth:`hit`, :meth:`miss`); the cache counts its
    evictions. The ``on_*`` hooks feed metrics: ``on_hit()``, ``on_miss()``, ``on_evict(n)``,
    ``on_size(entries)``.
    """

    def __init__(
        self,
        capacity: int,
        on_hit: Callable[[], None] = lambda: None,
        on_miss: Callable[[], None] = lambda: None,
        on_evict: Callable[[int], None] = lambda n: None,
        on_size: Callable[[int], None] = lambda n: None,
    ):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 0 <= capacity <= MAX_VOICE_CACHE_SIZE:
            raise ValueError(f"voice cache capacity must be an int in [0, {MAX_VOICE_CACHE_SIZE}], got {capacity!r}")
        self.capacity = capacity
        self.stats = VoiceCacheStats()
        self._items: "OrderedDict[str, Voice]" = OrderedDict()
        self._lock = threading.RLock()  # store() calls put() under it
        self._on_hit, self._on_miss, self._on_evict, self._on_size = on_hit, on_miss, on_evict, on_size

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, voice_id: str) -> bool:
        return voice_id in self._items

    def get(self, voice_id: str) -> Optional[Voice]:
        """The voice (now the most recently used) or None. Counts nothing."""
        with self._lock:
            v = self._items.get(voice_id)
            if v is not None:
                self._items.move_to_end(voice_id)
            return v

    def put(self, voice_id: str, voice: Voice) -> int:
        """Store (or replace) ``voice_id``; evict least recently used ones beyond capacity.
        Returns the number evicted."""
        if not isinstance(voice, Voice):
            raise TypeError(f"expected a Voice, got {type(voice).__name__}")
        with self._lock:
            if self.capacity == 0:
                return 0
            self._items[voice_id] = voice
            self._items.move_to_end(voice_id)
            n = 0
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
                n += 1
            self.stats.evictions += n
            size = len(self._items)
        if n:
            self._on_evict(n)
        self._on_size(size)
        return n

    def store(self, voice_id: str, voice: Voice, replace: bool) -> int:
        """:meth:`put`, unless ``voice_id`` holds a voice of another fingerprint and not
        ``replace``: then :class:`RequestError` (``voice_id``) and the cache is unchanged. The
        check and the store are one step (no other store can come in between)."""
        with self._lock:
            old = self._items.get(voice_id)
            if old is not None and old.fingerprint != voice.fingerprint and not replace:
                raise voice_conflict(voice_id)
            return self.put(voice_id, voice)

    def hit(self) -> None:
        with self._lock:
            self.stats.hits += 1
        self._on_hit()

    def miss(self) -> None:
        with self._lock:
            self.stats.misses += 1
        self._on_miss()


def voice_conflict(voice_id: str) -> RequestError:
    return RequestError(
        "voice_id",
        f"voice_id {voice_id!r} is stored with other reference audio; send replace_voice=true to "
        "replace it, or use another voice_id",
    )


@dataclass(frozen=True)
class ResolvedVoice:
    """What the talker gets for one Base request."""

    speaker_embedding: np.ndarray  # float32 [D]
    ref_codes: Optional[np.ndarray]  # int32 [R, 16] (in-context) or None (x-vector only)
    ref_text: Optional[str]
    x_vector_only: bool
    cache_hit: bool  # True: no encoder ran

    def apply(self, req: TtsRequest) -> TtsRequest:
        """``req`` with the resolved mode and transcript (what ``talker_inputs`` reads)."""
        return replace(req, x_vector_only=self.x_vector_only, ref_text=None if self.x_vector_only else self.ref_text)


# encode(audio, sample_rate, need_codes) -> (speaker_embedding [D] float32, codes [R, 16] or None)
Encode = Callable[[np.ndarray, int, bool], Awaitable[Tuple[np.ndarray, Optional[np.ndarray]]]]


async def resolve_voice(req: TtsRequest, cache: VoiceCache, encode: Encode) -> ResolvedVoice:
    """The voice of a validated Base request (see the module docstring for the rules).

    Raises :class:`RequestError` for an unknown ``voice_id`` or a mode the cached voice cannot
    serve. Counts one hit or one miss per request that names a ``voice_id``.
    """
    if req.task_type != "Base":
        raise ValueError("resolve_voice is for task_type Base")
    vid = req.voice_id
    fp = fingerprint(req.ref_audio, req.ref_sample_rate) if req.ref_audio is not None else None

    if vid is not None:
        entry = cache.get(vid)
        if entry is not None and fp is not None and fp != entry.fingerprint and not req.replace_voice:
            cache.miss()
            raise voice_conflict(vid)
        if entry is not None and (fp is None or fp == entry.fingerprint):
            if req.x_vector_only is not None:
                xvo = req.x_vector_only
            else:  # with ref_audio: in-context (as without a cache); voice_id alone: the stored mode
                xvo = False if fp is not None else entry.ref_codes is None
            if xvo or entry.ref_codes is not None:
                ref_text = entry.ref_text
                if not xvo and req.ref_text is not None and req.ref_text != entry.ref_text:
                    ref_text = req.ref_text  # same audio, corrected transcript: keep it
                    cache.put(vid, replace(entry, ref_text=ref_text))
                cache.hit()
                return ResolvedVoice(
                    entry.speaker_embedding,
                    None if xvo else entry.ref_codes,
                    None if xvo else ref_text,
                    bool(xvo),
                    True,
                )
            if fp is None:  # voice_id alone, in-context asked of an x-vector-only entry
                cache.miss()
                raise RequestError(
                    "x_vector_only",
                    f"voice_id {vid!r} was stored by an x-vector-only request "
                    "and has no reference codes; send x_vector_only=true, or send ref_audio, "
                    "ref_sample_rate and ref_text to store it for in-context cloning",
                )
        cache.miss()
        if req.ref_audio is None:
            raise RequestError(
                "voice_id",
                f"unknown voice_id {vid!r}: it is not in the voice cache (never "
                f"stored, or evicted: the cache keeps the {cache.capacity} most recently used "
                "voices); send ref_audio and ref_sample_rate (and ref_text for in-context "
                "cloning) with this voice_id to store it",
            )

    xvo = bool(req.x_vector_only)
    spk, codes = await encode(req.ref_audio, req.ref_sample_rate, not xvo)
    spk = np.ascontiguousarray(spk, dtype=np.float32).reshape(-1)
    if codes is not None:
        codes = np.ascontiguousarray(codes, dtype=np.int32)
    if vid is not None:  # refused if another request stored other audio under vid meanwhile
        voice = Voice(spk.copy(), None if codes is None else codes.copy(), None if xvo else req.ref_text, fp)
        cache.store(vid, voice, replace=req.replace_voice)
    return ResolvedVoice(spk, codes, None if xvo else req.ref_text, xvo, False)
