"""The codec decoder runtime behind the Python-backend ``codec_decoder`` model.

Backends:

* ``torch`` on CPU: eager decode of the package's :class:`~triton_qwen3_tts.model.codec.CodecDecoder`.
* ``torch`` on CUDA: one CUDA graph per (batch bucket, frames bucket), captured at warm-up, with
  static input/output buffers; a call copies its codes into the smallest bucket that fits
  (right-padded, exact because the decoder is causal), replays, and copies the used part out.
* ``onnxruntime``: the exported ONNX model (``export/export_codec_onnx.py``), CPU provider.

All take int64 ``[B, T, 16]`` and return float32 ``[B, T * 1920]``.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, Sequence, Tuple

import numpy as np

from triton_qwen3_tts.serving.codec.batch import bucket
from triton_qwen3_tts.serving.model_config import CodecModelConfig

log = logging.getLogger(__name__)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_FRAME_BUCKETS = (2, 4, 8, 16, 32, 64, 97, 128)


def torch_dtype(name: str):
    """The torch dtype of a ``codec_dtype`` / ``dtype`` setting value (float32, bfloat16, float16)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_codec_decoder(checkpoint_dir: str, device: str = "cpu", dtype=None):
    """The decoder of ``<checkpoint>/speech_tokenizer`` (validated, decoder tensors only) and the
    speech-tokenizer config; the one loader is ``checkpoint.load_codec_decoder``."""
    import torch

    from triton_qwen3_tts.model.checkpoint import load_codec_decoder as _load, load_speech_tokenizer_config

    cfg = load_speech_tokenizer_config(checkpoint_dir)
    decoder = _load(checkpoint_dir, device="cpu", st_config=cfg)
    return decoder.to(device=device, dtype=dtype or torch.float32).eval(), cfg


class TorchCodec:
    def __init__(self, cfg: CodecModelConfig, batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS):
        import torch

        self.torch = torch
        self.device = torch.device(cfg.device if cfg.device == "cpu" else "cuda")
        self.dtype = torch_dtype(cfg.dtype)
        self.decoder, self.st_cfg = load_codec_decoder(cfg.checkpoint, self.device, self.dtype)
        self.spf = self.st_cfg.samples_per_frame
        self.use_graphs = cfg.cuda_graphs and self.device.type == "cuda"
        self.frame_buckets = tuple(cfg.frame_buckets) or DEFAULT_FRAME_BUCKETS
        self.batch_buckets = tuple(batch_buckets)
        self._graphs: Dict[Tuple[int, int], tuple] = {}
        self._pool = None

    @property
    def samples_per_frame(self) -> int:
        return self.spf

    def _eager(self, codes):
        with self.torch.inference_mode():
            out = self.decoder(codes.transpose(1, 2))  # [B, 1, T*spf]
        return out[:, 0].float()

    def _graph(self, b: int, t: int):
        key = (b, t)
        if key not in self._graphs:
            torch = self.torch
            static_in = torch.zeros((b, t, 16), dtype=torch.long, device=self.device)
            s = torch.cuda.Stream(self.device)
            s.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(s):
                for _ in range(2):  # warm up kernels/allocator outside the graph
                    self._eager(static_in)
            torch.cuda.current_stream(self.device).wait_stream(s)
            # The warm-up's activations stay cached in the general pool while the capture allocates
            # its own pool: hand them back first, or loading needs twice the largest bucket's memory
            # (seen: out of memory at load on the H100 with batch 64 x 97 frames next to the talker).
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            g = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(g, pool=self._pool, stream=s, capture_error_mode="thread_local"):
                static_out = self._eager(static_in)
            self._graphs[key] = (g, static_in, static_out)
        return self._graphs[key]

    def warmup(self) -> None:
        """Capture every (batch, frames) bucket now, so no request pays for a capture."""
        if self.use_graphs:
            # largest first: the shared graph pool is sized once by the biggest bucket and the
            # smaller captures reuse its freed blocks
            for b in sorted(self.batch_buckets, reverse=True):
                for t in sorted(self.frame_buckets, reverse=True):
                    self._graph(b, t)
        else:
            self.decode(np.zeros((1, min(self.frame_buckets), 16), np.int64))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        torch = self.torch
        b, t, _ = codes.shape
        if not self.use_graphs or b > self.batch_buckets[-1] or t > self.frame_buckets[-1]:
            x = torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)).to(self.device)
            return self._eager(x).cpu().numpy()
        bb, tb = bucket(b, self.batch_buckets), bucket(t, self.frame_buckets)
        g, static_in, static_out = self._graph(bb, tb)
        static_in.zero_()
        static_in[:b, :t].copy_(torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64)), non_blocking=False)
        g.replay()
        return static_out[:b, : t * self.spf].cpu().numpy()


class OnnxCodec:
    def __init__(self, cfg: CodecModelConfig):
        import onnxruntime as ort

        from triton_qwen3_tts.model.config import SpeechTokenizerConfig

        self.session = ort.InferenceSession(cfg.onnx_path, providers=["CPUExecutionProvider"])
        st = SpeechTokenizerConfig.from_file(os.path.join(cfg.checkpoint, "speech_tokenizer", "config.json"))
        self.samples_per_frame = st.samples_per_frame
        self.input_name = self.session.get_inputs()[0].name

    def warmup(self) -> None:
        self.decode(np.zeros((1, 2, 16), np.int64))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: codes.astype(np.int64)})[0]


def make_codec(cfg: CodecModelConfig):
    return OnnxCodec(cfg) if cfg.runtime == "onnxruntime" else TorchCodec(cfg)
