"""Counter-based Gumbel noise for the engines: no generator state, so a request's draws depend only
on (its seed, the draw index, the candidate) -- never on batch composition, preemption, bucket or
CUDA-graph replay. Same seed -> same frames.

Two hashes live here, one per engine, because each engine's sampled frames for a given seed are
part of its tested behaviour:

* the native engine (:func:`hash_seed`, :func:`gumbel_noise`) hashes (request key, draw counter,
  candidate *rank* among its top ``max_top_k`` candidates);
* the vLLM talker (:func:`frame_gumbel_noise`) hashes (seed, frame, codebook, *vocabulary id*) over
  the whole vocabulary.

Both end in :func:`triton_qwen3_tts.model.sampling.gumbel_from_bits` (finite for every input).
"""

from __future__ import annotations

import torch

from triton_qwen3_tts.model.sampling import gumbel_from_bits

__all__ = ["hash_seed", "gumbel_noise", "frame_gumbel_noise"]

_M32 = 0xFFFFFFFF
_HASH_MUL = 0x45D9F3B


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors (values kept in [0, 2^32); products < 2^63)."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & _M32
    x = x ^ (x >> 12)
    return x


def hash_seed(seed: int) -> int:
    """A request's 32-bit RNG key from a (up to 63-bit) seed."""
    s = int(seed) & ((1 << 63) - 1)
    t = torch.tensor([s & _M32, (s >> 32) & _M32], dtype=torch.int64)
    return int(_mix32(t[0] ^ _mix32(t[1] + 0x51ED27)))


def _gumbel(key: torch.Tensor, counter: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise ``[B, J, K]`` for keys ``key [B]``, draw counters ``counter [B, J]`` and
    candidate ranks ``cols [K]``: every element depends only on its (key, counter, rank), so one
    call for all 15 residual draws of a frame equals 15 separate calls bit for bit."""
    s = _mix32(key[:, None] ^ _mix32(counter + 0x3C6EF372))  # [B, J]
    x = _mix32(s[..., None] ^ ((cols * 0x9E3779B1) & _M32))
    x = _mix32(x + 0x6A09E667)
    return gumbel_from_bits(x >> 8)  # finite for every input (sampling.gumbel_from_bits)


def gumbel_noise(key: torch.Tensor, counter: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise ``[B, K]`` fp32 for request keys ``key [B]``, draw counters
    ``counter [B]`` and candidate ranks ``cols [K]`` (all int64 on the same device)."""
    return _gumbel(key, counter[:, None], cols)[:, 0]


def _mix32_frame(x: torch.Tensor) -> torch.Tensor:
    """32-bit integer hash on int64 tensors holding values in [0, 2^32)."""
    x = (((x >> 16) ^ x) * _HASH_MUL) & _M32
    x = (((x >> 16) ^ x) * _HASH_MUL) & _M32
    return (x >> 16) ^ x


def frame_gumbel_noise(seed: torch.Tensor, frame: torch.Tensor, codebook: int, vocab: int) -> torch.Tensor:
    """Gumbel(0,1) noise ``[R, vocab]`` from hash(seed, frame, codebook, code), float32."""
    seed = seed.to(torch.int64)
    lo = seed & _M32
    hi = (seed >> 32) & _M32
    ctr = (frame.to(torch.int64).clamp(min=0) * 16 + codebook) & _M32
    base = _mix32_frame(lo ^ _mix32_frame(hi ^ _mix32_frame(ctr)))  # [R]
    v = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    vm = _mix32_frame((v * 0x9E3779B1 + 0x7F4A7C15) & _M32)  # [V]
    x = _mix32_frame(base[:, None] ^ vm[None, :]) >> 8  # 24 bits
    return gumbel_from_bits(x)  # finite for every x (a float32 u could round to 1.0: +inf)
