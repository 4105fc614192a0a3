"""Reference generation loop: prompt embeddings -> codec frames ``[T, 16]``.

Why: this is the exact, seedable, one-request loop that serving engines are compared with.
It follows the official ``generate()`` step for step:

1. Prefill the talker with the prompt; sample ``c0_0`` from the last position; ``h_0`` is that
   position's final-norm hidden state.
2. For g = 0, 1, ...: stop if ``c0_g`` is EOS (the EOS frame is not emitted); run the code
   predictor on ``(h_g, c0_g)`` -> c1..c15 and emit the frame; feed
   ``F(frame_g) + (trailing[g] if g < N else tts_pad)`` as the next talker position; sample
   ``c0_{g+1}`` from it.

``max_new_tokens`` counts sampled c0 tokens, as in HF: with ``max_new_tokens = N`` and no EOS
the loop returns N-1 frames, because the N-th c0 never gets its residual codes (the official
code does the same).
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch

from triton_qwen3_tts.model.sampling import SamplingParams, sample_c0, sample_residual
from triton_qwen3_tts.model.talker import Talker

__all__ = ["generate_codes"]


def _check_embeds(name: str, t: torch.Tensor, dims: int, width: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims or t.shape[-1] != width:
        shape = "[L, D]" if dims == 2 else "[D]"
        raise ValueError(f"{name} must be {shape} with D = {width}, got {tuple(t.shape)}")


@torch.no_grad()  # not inference_mode: callers may reuse the codes in autograd-tracked code
def generate_codes(
    talker: Talker,
    prompt_embeds: torch.Tensor,
    trailing: torch.Tensor,
    tts_pad_embed: torch.Tensor,
    params: SamplingParams,
    generator: Optional[torch.Generator] = None,
    on_frame: Optional[Callable[[torch.Tensor], None]] = None,
) -> torch.Tensor:
    """Generate the codec frames of one request.

    Args:
        talker: the reference :class:`~triton_qwen3_tts.model.talker.Talker`.
        prompt_embeds: ``[L, D]`` prefill rows (``prompt.embed_prompt``), L >= 1.
        trailing: ``[N, D]`` text queue fed one row per frame (may be ``[0, D]``).
        tts_pad_embed: ``[D]`` (or ``[1, D]``): T(tts_pad), fed after the queue runs out.
        params: sampling settings; ``params.seed`` seeds a private generator when
            ``generator`` is None (otherwise the global RNG is used).
        generator: explicit RNG for every draw (c0 and residuals), in draw order.
        on_frame: called with each emitted frame ``[16]`` (int64, on the talker's device) as
            soon as it exists, for streaming.

    Returns:
        int64 ``[T, 16]`` on the CPU; T <= max_new_tokens - 1.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    cfg = talker.config
    d = cfg.hidden_size
    _check_embeds("prompt_embeds", prompt_embeds, 2, d)
    _check_embeds("trailing", trailing, 2, d)
    if prompt_embeds.shape[0] == 0:
        raise ValueError("prompt_embeds must have at least one row")
    if isinstance(tts_pad_embed, torch.Tensor) and tts_pad_embed.dim() == 2 and tts_pad_embed.shape[0] == 1:
        tts_pad_embed = tts_pad_embed[0]
    _check_embeds("tts_pad_embed", tts_pad_embed, 1, d)

    weight = talker.codec_head.weight
    dev, dtype = weight.device, weight.dtype
    if generator is None and params.seed is not None:
        generator = torch.Generator(device=dev).manual_seed(params.seed)
    eos, cb = cfg.codec_eos_token_id, cfg.codebook_size
    trailing = trailing.to(dev, dtype)
    tts_pad = tts_pad_embed.to(dev, dtype)

    def next_c0(hidden_last: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return sample_c0(talker.codec_logits(hidden_last), history, params, eos, cb, generator)

    def residual_sampler(_codebook: int, logits: torch.Tensor) -> torch.Tensor:
        return sample_residual(logits, params, generator)

    hidden, cache = talker(prompt_embeds.to(dev, dtype)[None])  # positions 0..L-1
    h = hidden[:, -1]  # [1, D]
    history = torch.zeros(1, 0, dtype=torch.long, device=dev)
    c0 = next_c0(h, history)
    history = torch.cat([history, c0[:, None]], dim=1)

    frames: List[torch.Tensor] = []
    for g in range(params.max_new_tokens - 1):
        if int(c0[0]) == eos:
            break
        residual = talker.predict_residuals(h, c0, residual_sampler)  # [1, 15]
        frame = torch.cat([c0[:, None], residual], dim=1)  # [1, 16]
        frames.append(frame[0])
        if on_frame is not None:
            on_frame(frame[0])
        text = trailing[g] if g < trailing.shape[0] else tts_pad
        hidden, cache = talker((talker.embed_frame(frame) + text)[:, None], None, cache)  # next position
        h = hidden[:, -1]
        c0 = next_c0(h, history)
        history = torch.cat([history, c0[:, None]], dim=1)
    if not frames:
        return torch.zeros(0, cfg.num_code_groups, dtype=torch.long)
    return torch.stack(frames).cpu()
