"""Reference generation loop (spec 3.3): prompt embeddings -> frames [T, 16].

One request at a time, exact and seedable. With ``max_new_tokens = N`` and no EOS it returns N-1
frames, as the official ``generate()`` does (the N-th sampled c0 never gets its residual codes);
the EOS frame is never emitted.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .sampling import SamplingParams, process_c0_logits, warp_and_sample
from .talker import Talker


@torch.inference_mode()
def generate_codes(talker: Talker, prompt_embeds: torch.Tensor, trailing: torch.Tensor,
                   tts_pad_embed: torch.Tensor, params: SamplingParams,
                   generator: Optional[torch.Generator] = None,
                   on_frame: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
    """Generate the frames of one request. ``prompt_embeds`` [L, D], ``trailing`` [N, D],
    ``tts_pad_embed`` [D] (or [1, D]). Returns int64 [T, 16]; ``on_frame`` gets each [16] frame."""
    cfg = talker.config
    dev = talker.codec_head.weight.device
    dtype = talker.codec_head.weight.dtype
    if generator is None and params.seed is not None and (params.do_sample or params.subtalker_dosample):
        generator = torch.Generator(device=dev).manual_seed(params.seed)
    x = prompt_embeds.to(dev, dtype)[None]
    trailing = trailing.to(dev, dtype)
    tts_pad = tts_pad_embed.to(dev, dtype).reshape(-1)
    L = x.shape[1]

    hidden, cache = talker(x, torch.arange(L, device=dev)[None])
    h = hidden[:, -1]
    history = torch.zeros(1, 0, dtype=torch.long, device=dev)

    def sample_c0(h):
        logits = process_c0_logits(talker.codec_logits(h), history, history.shape[1], params,
                                   cfg.codec_eos_token_id, cfg.codebook_size)
        return warp_and_sample(logits, params.do_sample, params.temperature, params.top_k, params.top_p, generator)

    def sample_residual(j, logits):
        return warp_and_sample(logits.float(), params.subtalker_dosample, params.subtalker_temperature,
                               params.subtalker_top_k, params.subtalker_top_p, generator)

    frames = []
    c0 = sample_c0(h)
    history = torch.cat([history, c0[:, None]], dim=1)
    for g in range(params.max_new_tokens - 1):
        if int(c0[0]) == cfg.codec_eos_token_id:
            break
        residual = talker.code_predictor.predict(h, talker.embed_codec(c0), sample_residual)
        frame = torch.cat([c0[:, None], residual], dim=1)  # [1, 16]
        frames.append(frame[0])
        if on_frame is not None:
            on_frame(frame[0])
        text = trailing[g] if g < trailing.shape[0] else tts_pad
        inp = (talker.embed_frame(frame) + text)[:, None]  # [1, 1, D]
        hidden, cache = talker(inp, torch.full((1, 1), L + g, device=dev), cache)
        h = hidden[:, -1]
        c0 = sample_c0(h)
        history = torch.cat([history, c0[:, None]], dim=1)
    if not frames:
        return torch.zeros(0, cfg.num_code_groups, dtype=torch.long)
    return torch.stack(frames).cpu()
