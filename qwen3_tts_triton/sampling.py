"""Sampling for the reference generation loop (spec 3.3-3.4), in Hugging Face's processor order.

Codebook 0 (the talker's 3072-way head), per step:
  1. repetition penalty over this request's previous c0 tokens (logit / p if > 0 else logit * p);
  2. ``min_new_tokens``: EOS masked while fewer than that many tokens were sampled;
  3. suppression of the special ids [2048, 3072) except EOS;
  4-6. temperature, top-k, top-p (sampling only);
  7. multinomial draw (or argmax in greedy mode; greedy still applies 1-3, as HF does).
Residual codebooks (2048-way): temperature and top-k only, no penalty, no suppression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Optional

import torch

from .config import GenerationDefaults


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    min_new_tokens: int = 2
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048
    seed: Optional[int] = None
    ignore_eos: bool = False  # fixed-length benchmark mode: EOS is never sampled

    def __post_init__(self):
        for name, t, k in (("temperature", self.temperature, self.top_k),
                           ("subtalker_temperature", self.subtalker_temperature, self.subtalker_top_k)):
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {t!r}")
        for name in ("top_k", "subtalker_top_k", "max_new_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("top_p", "subtalker_top_p"):
            v = getattr(self, name)
            if not (0 < v <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {v!r}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an int >= 0, got {self.min_new_tokens!r}")

    @classmethod
    def from_defaults(cls, defaults: GenerationDefaults, **overrides) -> "SamplingParams":
        kw = {f.name: getattr(defaults, f.name) for f in fields(cls) if hasattr(defaults, f.name)}
        kw.update(overrides)
        return cls(**kw)

    def with_(self, **kw) -> "SamplingParams":
        return replace(self, **kw)


def process_c0_logits(logits: torch.Tensor, history: torch.Tensor, num_generated: int, p: SamplingParams,
                      eos_id: int, codebook_size: int) -> torch.Tensor:
    """Steps 1-3 on logits [B, V] (float32). ``history``: [B, n] previous c0 ids of each row."""
    logits = logits.float().clone()
    if p.repetition_penalty != 1.0 and history.numel():
        prev = logits.gather(1, history)
        prev = torch.where(prev > 0, prev / p.repetition_penalty, prev * p.repetition_penalty)
        logits.scatter_(1, history, prev)
    if num_generated < p.min_new_tokens or p.ignore_eos:
        logits[:, eos_id] = float("-inf")
    keep_eos = logits[:, eos_id].clone()
    logits[:, codebook_size:] = float("-inf")
    logits[:, eos_id] = keep_eos
    return logits


def warp_and_sample(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int, top_p: float,
                    generator: Optional[torch.Generator]) -> torch.Tensor:
    """Temperature, top-k, top-p, then a multinomial draw; argmax when not sampling. [B, V] -> [B]."""
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits / temperature
    k = min(top_k, scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1, None]
    scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, idx, remove), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
