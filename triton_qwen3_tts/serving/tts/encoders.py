"""The reference encoders of Base voice cloning, as the `tts` model runs them (torch, no Triton).

Reference audio (validated by ``request.py``) is resampled to 24 kHz with soxr HQ
(``audio.resample``, what the official ``librosa.resample`` does), then the ECAPA speaker
encoder gives the x-vector and, in in-context mode, the Mimi codec encoder gives the reference
codes ``[R, 16]``. Both run in fp32 on one worker thread off the event loop: an encode of a few
seconds of audio takes tens of milliseconds on a GPU and must not stall other streams' chunks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Callable, Optional, Tuple

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["ReferenceEncoders"]


class ReferenceEncoders:
    """Speaker encoder + codec encoder of one Base checkpoint.

    ``on_run(encoder_name)`` is called once per encoder run ("speaker", "codec"), for metrics.
    """

    def __init__(self, checkpoint: str, device: str = "cpu", on_run: Callable[[str], None] = lambda name: None):
        import torch

        from triton_qwen3_tts.model.checkpoint import load_reference_encoders

        self.device = torch.device(device)
        self.speaker, self.codec = load_reference_encoders(checkpoint, self.device)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ref-encoders")
        # Warm up (lazy codebook cache, kernels) before the model reports ready; not counted.
        self.on_run = lambda name: None
        t = np.arange(24000) / 24000.0
        self.encode((0.1 * np.sin(2 * np.pi * 220.0 * t)).astype(np.float32), 24000, True)
        self.on_run = on_run

    def encode(self, audio: np.ndarray, sample_rate: int, need_codes: bool) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """(x-vector float32 [D], codes int32 [R, 16] or None) of mono float32 ``audio``."""
        from triton_qwen3_tts.model.audio import resample
        from triton_qwen3_tts.model.codec_encoder import encode_reference
        from triton_qwen3_tts.model.speaker_encoder import extract_speaker_embedding

        wav = resample(np.ascontiguousarray(audio, dtype=np.float32), int(sample_rate))
        spk = extract_speaker_embedding(self.speaker, wav).float().cpu().numpy()
        self.on_run("speaker")
        codes = None
        if need_codes:
            codes = encode_reference(self.codec, wav).astype(np.int32)
            self.on_run("codec")
        return spk, codes

    async def encode_async(self, audio: np.ndarray, sample_rate: int, need_codes: bool):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.encode, audio, sample_rate, need_codes)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
