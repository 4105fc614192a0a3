"""What both talker engines share: the request type, the refusal error, the checks made before a
request is scheduled, and the codec-frame constants.

The vLLM engine (:mod:`triton_qwen3_tts.engines.vllm`) and the native engine
(:mod:`triton_qwen3_tts.engines.native`) take a :class:`TalkerRequest` and stream ``np.int32 [n, 16]``
frame chunks; the counter-based noise both sample with is in :mod:`triton_qwen3_tts.engines.rng`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from triton_qwen3_tts.model.config import GenerationDefaults

__all__ = [
    "NUM_CHANNEL",
    "SUPPRESS_START",
    "EngineError",
    "TalkerRequest",
    "check_prompt_frames_trailing",
    "check_sampling_fields",
]

NUM_CHANNEL = 16  # codebooks per codec frame
# sampling defaults: the official generation_config.json (model/config.py GenerationDefaults)
_GEN = GenerationDefaults()
SUPPRESS_START = 2048  # codebook-0 ids from here on are special tokens (suppressed but EOS)


class EngineError(ValueError):
    """A request or a config the engine refuses before anything is scheduled.

    ``field``: the talker input the refusal is about (``max_frames``, ``text``, ``top_k``, ...),
    so the serving layer reports it as that input's INVALID_ARG without reading the message;
    None for refusals that are no input's fault (engine not started, a duplicate request id)."""

    def __init__(self, message: str = "", field: Optional[str] = None):
        super().__init__(message)
        self.field = field


def check_prompt_frames_trailing(req: "TalkerRequest", hidden: int, max_model_len: int, max_trailing_tokens: int):
    """The checks both engines make before scheduling: prompt and trailing shapes, the frame
    budget within ``max_model_len``, and temperature. Returns (prompt_embeds, trailing) tensors."""
    import torch

    pe = torch.as_tensor(req.prompt_embeds)
    if pe.dim() != 2 or pe.shape[1] != hidden:
        raise EngineError(f"prompt_embeds must be [L, {hidden}], got {tuple(pe.shape)}", field="text")
    L = int(pe.shape[0])
    if L < 1:
        raise EngineError("prompt_embeds is empty", field="text")
    if L > max_model_len - 2:
        raise EngineError(
            f"prompt of {L} rows is too long: max_model_len={max_model_len} "
            f"allows at most {max_model_len - 2} prompt rows (+1 frame)",
            field="text",
        )
    limit = max_model_len - L - 1
    if not isinstance(req.max_frames, int) or isinstance(req.max_frames, bool) or req.max_frames < 1:
        raise EngineError(f"max_frames must be a positive int, got {req.max_frames!r}", field="max_frames")
    if req.max_frames > limit:
        raise EngineError(
            f"max_frames={req.max_frames} exceeds max_model_len - prompt_len - 1 "
            f"= {limit} for a prompt of {L} rows (max_model_len={max_model_len})",
            field="max_frames",
        )
    tr = torch.as_tensor(req.trailing if req.trailing is not None else torch.zeros(0, hidden))
    if tr.dim() != 2 or tr.shape[1] != hidden:
        raise EngineError(f"trailing must be [N, {hidden}], got {tuple(tr.shape)}", field="text")
    if tr.shape[0] > max_trailing_tokens:
        raise EngineError(
            f"trailing text of {tr.shape[0]} rows > max_trailing_tokens={max_trailing_tokens}", field="text"
        )
    if not (req.greedy or (req.temperature > 0 and math.isfinite(req.temperature))):
        raise EngineError("temperature must be > 0 unless greedy", field="temperature")
    return pe, tr


def check_sampling_fields(req: "TalkerRequest", vocab: int, sub_vocab: int, max_top_k: Optional[int] = None) -> None:
    """The sampling settings both engines check before scheduling; each refusal names the
    `talker`/`tts` input it comes from (``subtalker_*`` for the code predictor's ``sub_*``).
    ``vocab``/``sub_vocab``: codebook-0 and residual vocabulary sizes (a larger top-k keeps every
    id); ``max_top_k``: the engine's candidate limit (the native engine samples among its top
    ``max_top_k`` ids), None = no limit."""
    sub_greedy = req.greedy if req.sub_greedy is None else req.sub_greedy
    for field, v, greedy in (
        ("temperature", req.temperature, req.greedy),
        ("subtalker_temperature", req.sub_temperature, sub_greedy),
    ):
        if not greedy and not (_is_number(v) and math.isfinite(v) and v > 0):
            raise EngineError(f"{field} must be a finite number > 0 unless greedy, got {v!r}", field=field)
    for field, v, size in (("top_k", req.top_k, vocab), ("subtalker_top_k", req.sub_top_k, sub_vocab)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise EngineError(f"{field} must be an int >= 1, got {v!r}", field=field)
        if max_top_k is not None and max_top_k < size and v > max_top_k:
            raise EngineError(
                f"{field} must be in [1, {max_top_k}] on this engine (it samples among its top "
                f"max_top_k={max_top_k} candidates), got {v}",
                field=field,
            )
    for field, v in (("top_p", req.top_p), ("subtalker_top_p", req.sub_top_p)):
        if not (_is_number(v) and 0 < v <= 1):
            raise EngineError(f"{field} must be in (0, 1], got {v!r}", field=field)
    rp = req.repetition_penalty
    if not (_is_number(rp) and math.isfinite(rp) and rp > 0):
        raise EngineError(f"repetition_penalty must be a finite number > 0, got {rp!r}", field="repetition_penalty")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class TalkerRequest:
    """One talker generation. ``prompt_embeds [L, D]`` and ``trailing [N, D]`` (may be empty).

    Codebook 0: ``temperature``/``top_k``/``top_p``/``repetition_penalty``/``min_new_tokens``,
    ``greedy`` overrides to argmax. Residual codebooks: ``sub_*`` (the official ``subtalker_*``;
    ``sub_greedy=None`` follows ``greedy``). ``seed`` drives the hashed noise of all 16 codebooks; ``None``: one random
    63-bit draw per request.
    ``max_frames``: frames to produce at most (EOS may stop earlier).
    """

    request_id: str
    prompt_embeds: "object"
    trailing: "object" = None
    max_frames: int = 256
    greedy: bool = False
    temperature: float = _GEN.temperature
    top_k: int = _GEN.top_k
    top_p: float = _GEN.top_p
    repetition_penalty: float = _GEN.repetition_penalty
    min_new_tokens: int = _GEN.min_new_tokens
    sub_greedy: Optional[bool] = None
    sub_temperature: float = _GEN.subtalker_temperature
    sub_top_k: int = _GEN.subtalker_top_k
    sub_top_p: float = _GEN.subtalker_top_p
    seed: Optional[int] = None
    suppress_eos: bool = False  # benchmarks: never stop on EOS

    @classmethod
    def from_sampling(cls, request_id, prompt_embeds, trailing, sampling, max_frames=None, seed=None):
        """Build from an object with the official generate kwargs names (``do_sample``,
        ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``subtalker_*``,
        ``max_new_tokens``, ``min_new_tokens``), e.g. :class:`triton_qwen3_tts.model.sampling.SamplingParams`."""
        g = lambda k, d: getattr(sampling, k, d)  # noqa: E731
        do_sample = bool(g("do_sample", True))
        sub_sample = bool(g("subtalker_dosample", do_sample))
        mf = max_frames if max_frames is not None else int(g("max_new_tokens", _GEN.max_new_tokens)) - 1
        return cls(
            request_id=request_id,
            prompt_embeds=prompt_embeds,
            trailing=trailing,
            max_frames=mf,
            greedy=not do_sample,
            temperature=float(g("temperature", _GEN.temperature)),
            top_k=int(g("top_k", _GEN.top_k)),
            top_p=float(g("top_p", _GEN.top_p)),
            repetition_penalty=float(g("repetition_penalty", _GEN.repetition_penalty)),
            min_new_tokens=int(g("min_new_tokens", _GEN.min_new_tokens)),
            sub_greedy=not sub_sample,
            sub_temperature=float(g("subtalker_temperature", _GEN.subtalker_temperature)),
            sub_top_k=int(g("subtalker_top_k", _GEN.subtalker_top_k)),
            sub_top_p=float(g("subtalker_top_p", _GEN.subtalker_top_p)),
            seed=seed if seed is not None else g("seed", None),
        )
