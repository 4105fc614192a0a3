"""Sampling for the reference generation loop, in Hugging Face's processor order.

Why HF's order: the official model samples through ``transformers.generate``, whose
``_get_logits_processor`` applies, per step and on fp32 logits:

Codebook 0 (the talker's ``vocab_size``-way head, 3072):
  1. repetition penalty over this request's previously sampled c0 tokens
     (``logit / p`` if the logit is > 0, else ``logit * p``; the prompt has no ids);
  2. ``min_new_tokens``: EOS masked while fewer than that many tokens were sampled;
  3. suppression of every special id in ``[codebook_size, vocab_size)`` except EOS;
  4-6. only when sampling: temperature, top-k, top-p (top-p 1.0 is a no-op);
  7. a multinomial draw, or argmax when ``do_sample`` is False. Greedy still applies 1-3,
     exactly as HF does.
Residual codebooks 1..15 (2048-way, the sub-talker's ``generate``): no penalty, no suppression,
no min length; temperature, top-k, top-p when ``subtalker_dosample``, else argmax.

Extension (not in the official model): ``ignore_eos`` masks EOS at every step, for
fixed-length benchmark runs: a talker with random weights almost never samples EOS.

Pure PyTorch; imports neither vLLM nor Triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

import torch

from triton_qwen3_tts.model.config import GenerationDefaults

_GEN = GenerationDefaults()  # the official defaults, written once (model/config.py)

__all__ = [
    "SamplingParams",
    "apply_repetition_penalty",
    "mask_eos_before_min_tokens",
    "suppress_special_ids",
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "process_c0_logits",
    "warp_and_sample",
    "sample_c0",
    "sample_residual",
    "gumbel_from_bits",
]


def gumbel_from_bits(bits24: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise, float32, from 24 random bits per element (int64 in [0, 2^24)).

    ``u = (bits + 0.5) / 2^24`` lies strictly inside (0, 1), but in float32 the top value
    ``1 - 2^-25`` rounds to 1.0, and ``-log(-log(1)) = +inf``; a masked (``-inf``) logit plus
    ``+inf`` is NaN, which ``argmax`` picks: a suppressed token got sampled once in CI. Here ``u``
    and the logs are computed in float64 (exact for every input), and only the finite result is
    cast to float32. Shared by the vLLM talker's and the native engine's samplers."""
    u = (bits24.to(torch.float64) + 0.5) * (1.0 / 16777216.0)
    return (-torch.log(-torch.log(u))).to(torch.float32)


_NEG_INF = float("-inf")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; names follow the official ``generate()`` kwargs.

    Defaults are those of the official ``generation_config.json`` except ``max_new_tokens``,
    which takes the wrapper fallback 2048 (the file says 8192; use :meth:`from_defaults`).
    Temperatures are checked only for the stage that samples: greedy ignores them, as HF does.
    """

    do_sample: bool = _GEN.do_sample
    temperature: float = _GEN.temperature
    top_k: int = _GEN.top_k
    top_p: float = _GEN.top_p
    repetition_penalty: float = _GEN.repetition_penalty
    min_new_tokens: int = _GEN.min_new_tokens
    subtalker_dosample: bool = _GEN.subtalker_dosample
    subtalker_temperature: float = _GEN.subtalker_temperature
    subtalker_top_k: int = _GEN.subtalker_top_k
    subtalker_top_p: float = _GEN.subtalker_top_p
    max_new_tokens: int = _GEN.max_new_tokens
    seed: Optional[int] = None
    ignore_eos: bool = False  # fixed-length benchmark mode: EOS is never sampled

    def __post_init__(self) -> None:
        for name in ("do_sample", "subtalker_dosample", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name, active in (("temperature", self.do_sample), ("subtalker_temperature", self.subtalker_dosample)):
            v = getattr(self, name)
            if not _is_number(v) or (active and not (math.isfinite(v) and v > 0)):
                raise ValueError(f"{name} must be a finite number > 0 when sampling, got {v!r}")
        for name in ("top_k", "subtalker_top_k", "max_new_tokens"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("top_p", "subtalker_top_p"):
            v = getattr(self, name)
            if not _is_number(v) or not (0 < v <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")
        rp = self.repetition_penalty
        if not _is_number(rp) or not (math.isfinite(rp) and rp > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {rp!r}")
        if not _is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an int >= 0, got {self.min_new_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")

    @classmethod
    def from_defaults(cls, defaults: GenerationDefaults, **overrides: Any) -> "SamplingParams":
        """Merge, as the official wrapper does: explicit ``overrides`` beat ``defaults``.

        Overrides whose value is None are ignored (so optional request fields can be passed
        straight through); unknown names raise.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}; allowed: {sorted(names)}")
        kw = {n: getattr(defaults, n) for n in names if hasattr(defaults, n)}
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)

    def with_(self, **kw: Any) -> "SamplingParams":
        """A validated copy with some fields replaced."""
        return replace(self, **kw)


# --------------------------------------------------------------------------------------------
# Individual processors (each on fp32 logits [B, V]; each returns a new tensor)
# --------------------------------------------------------------------------------------------


def apply_repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF ``RepetitionPenaltyLogitsProcessor``: every id in ``history [B, n]`` gets
    ``logit / penalty`` if its logit is > 0, else ``logit * penalty`` (once, however often it
    occurred)."""
    out = logits.clone()
    if penalty == 1.0 or history.numel() == 0:
        return out
    prev = out.gather(1, history)
    prev = torch.where(prev > 0, prev / penalty, prev * penalty)
    return out.scatter(1, history, prev)


def mask_eos_before_min_tokens(
    logits: torch.Tensor, num_generated: int, min_new_tokens: int, eos_id: int
) -> torch.Tensor:
    """HF ``MinNewTokensLengthLogitsProcessor``: EOS is -inf while ``num_generated`` (tokens
    already sampled) is below ``min_new_tokens``."""
    out = logits.clone()
    if num_generated < min_new_tokens:
        out[:, eos_id] = _NEG_INF
    return out


def suppress_special_ids(logits: torch.Tensor, codebook_size: int, eos_id: int) -> torch.Tensor:
    """HF ``SuppressTokensLogitsProcessor`` with the official list: ids in
    ``[codebook_size, V)`` except EOS are -inf, so c0 is a real code or EOS."""
    out = logits.clone()
    keep = out[:, eos_id].clone()
    out[:, codebook_size:] = _NEG_INF
    out[:, eos_id] = keep
    return out


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """HF ``TemperatureLogitsWarper``: divide by the temperature."""
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """HF ``TopKLogitsWarper``: logits below the k-th largest become -inf (ties kept)."""
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, _NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """HF ``TopPLogitsWarper``: keep the smallest set of most likely ids whose probability sum
    reaches ``p`` (at least one id); ``p == 1`` is a no-op."""
    if p >= 1.0:
        return logits.clone()
    sorted_logits, idx = torch.sort(logits, descending=False, dim=-1)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(-1, idx, remove_sorted)
    return logits.masked_fill(remove, _NEG_INF)


# --------------------------------------------------------------------------------------------
# Composed steps
# --------------------------------------------------------------------------------------------


def process_c0_logits(
    logits: torch.Tensor, history: torch.Tensor, num_generated: int, p: SamplingParams, eos_id: int, codebook_size: int
) -> torch.Tensor:
    """Steps 1-3 (applied in greedy mode too) on codebook-0 logits ``[B, V]``; returns fp32.

    ``history`` ``[B, n]``: the c0 ids sampled so far in each row; ``num_generated``: how
    many tokens were sampled so far (equals ``n`` in the reference loop).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    if not (0 <= eos_id < logits.shape[-1] and 0 < codebook_size <= logits.shape[-1]):
        raise ValueError(f"eos_id {eos_id} / codebook_size {codebook_size} outside vocab {logits.shape[-1]}")
    out = apply_repetition_penalty(logits.float(), history, p.repetition_penalty)
    out = mask_eos_before_min_tokens(out, num_generated, p.min_new_tokens, eos_id)
    if p.ignore_eos:
        out[:, eos_id] = _NEG_INF
    return suppress_special_ids(out, codebook_size, eos_id)


def warp_and_sample(
    logits: torch.Tensor,
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Steps 4-7: temperature, top-k, top-p, multinomial; argmax when not sampling. ``[B, V] -> [B]``.

    The draw uses ``generator`` (seedable, per request); None uses torch's global RNG.
    """
    logits = logits.float()
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_c0(
    logits: torch.Tensor,
    history: torch.Tensor,
    p: SamplingParams,
    eos_id: int,
    codebook_size: int,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """All seven codebook-0 steps: ``[B, V]`` logits and ``[B, n]`` history -> ids ``[B]``."""
    scores = process_c0_logits(logits, history, history.shape[1], p, eos_id, codebook_size)
    return warp_and_sample(scores, p.do_sample, p.temperature, p.top_k, p.top_p, generator)


def sample_residual(
    logits: torch.Tensor, p: SamplingParams, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """A residual codebook (1..15): sub-talker temperature, top-k, top-p, or argmax. ``[B, V] -> [B]``."""
    return warp_and_sample(
        logits, p.subtalker_dosample, p.subtalker_temperature, p.subtalker_top_k, p.subtalker_top_p, generator
    )
