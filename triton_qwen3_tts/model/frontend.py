"""Prompt front end shared by the talker engines: request fields -> prompt embeddings.

Both engines (vLLM and native) consume ``prompt_embeds [L, D]`` and the trailing text rows
``[N, D]`` (layout: :mod:`triton_qwen3_tts.model.prompt`). Building them needs the text tokenizer
and four embedding tables of the checkpoint, not the transformer; this module loads exactly those
tensors from ``model.safetensors`` (names as in the official checkpoint), so a server process does
not hold a second copy of the talker's layers. Embedding work runs in float32, the table lookups on
the CPU. The text projection (two text-width GEMMs per text row: 16.8 MFLOP a row for the 1.7B
model, 5-10 ms of one CPU core for a sentence) runs on the CPU too, or, with ``project_device``, on
a GPU: there it takes tens of microseconds, on a high-priority stream of its own, so that it neither
waits for nor delays the engine's work on the default stream; the rows come back to the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.model.prompt import PromptLayout, PromptRequest, build_prompt, embed_prompt, validate_request

_PREFIX = "talker."


class _TextProjection(nn.Module):
    def __init__(self, d_text: int, d: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(d_text, d_text, bias=True)
        self.linear_fc2 = nn.Linear(d_text, d, bias=True)

    def forward(self, x):
        return self.linear_fc2(torch.nn.functional.silu(self.linear_fc1(x)))


class PromptEmbedder(nn.Module):
    """The talker's input tables: T(id) = text_projection(text_embedding(id)), C(id), E_j(code)."""

    def __init__(self, config: Qwen3TTSConfig):
        super().__init__()
        t = config.talker
        self.text_embedding = nn.Embedding(t.text_vocab_size, t.text_hidden_size)
        self.text_projection = _TextProjection(t.text_hidden_size, t.hidden_size)
        self.codec_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        self.residual_embeddings = nn.ModuleList(
            nn.Embedding(t.code_predictor.vocab_size, t.hidden_size) for _ in range(t.num_code_groups - 1)
        )

    # checkpoint key -> our parameter name
    @staticmethod
    def key_map(config: Qwen3TTSConfig) -> dict:
        m = {
            "talker.model.text_embedding.weight": "text_embedding.weight",
            "talker.model.codec_embedding.weight": "codec_embedding.weight",
        }
        for i in (1, 2):
            for p in ("weight", "bias"):
                m[f"talker.text_projection.linear_fc{i}.{p}"] = f"text_projection.linear_fc{i}.{p}"
        for j in range(config.talker.num_code_groups - 1):
            m[f"talker.code_predictor.model.codec_embedding.{j}.weight"] = f"residual_embeddings.{j}.weight"
        return m

    _stream = None  # set by project_on: the side stream of a GPU projection
    # GPU projection: rows padded to a power of two, at least this many, and every such size up to
    # WARM_ROWS projected once at load
    MIN_ROWS, WARM_ROWS = 16, 2048

    def project_on(self, device) -> "PromptEmbedder":
        """Run the text projection on ``device`` (a GPU; the tables stay on the CPU).

        On the GPU each call's rows are padded to a power of two (:func:`padded_rows`), and every
        such size up to ``WARM_ROWS`` is projected once here: cuBLAS picks a kernel per shape, and a
        kernel's first launch loads it (CUDA loads modules lazily), which on the H100 delayed a
        request's first audio by 40-140 ms the first time a text of a new length came (run 30,
        docs/benchmark-history.md). With few shapes, all seen at load, no request pays for that."""
        device = torch.device(device)
        if device.type != "cpu":
            self.text_projection.to(device)
            self._stream = torch.cuda.Stream(device=device, priority=-1)
            self._warm()
        return self

    def _warm(self) -> None:
        """Project zero rows of every padded size up to ``WARM_ROWS`` on the side stream."""
        w = self.text_projection.linear_fc1.weight
        with torch.inference_mode(), torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            m = self.MIN_ROWS
            while m <= self.WARM_ROWS:
                self.text_projection(torch.zeros((m, w.shape[1]), device=w.device, dtype=w.dtype))
                m *= 2
            self._stream.synchronize()

    def embed_text(self, ids):
        x = self.text_embedding(torch.as_tensor(ids, dtype=torch.long))
        if self._stream is None:
            return self.text_projection(x)
        lead, d = x.shape[:-1], x.shape[-1]
        x = x.reshape(-1, d)
        n = x.shape[0]
        xp = torch.zeros((padded_rows(n, self.MIN_ROWS), d), dtype=x.dtype)
        xp[:n] = x
        # the projection's device is made current for the call (prompt threads start on device 0:
        # leaving the stream alone would switch back to device 0 eagerly and open a CUDA context
        # there from every other GPU's worker); the blocking copy back waits for this stream alone
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            y = self.text_projection(xp.to(self._stream.device))[:n].cpu()
        return y.reshape(*lead, y.shape[-1])

    def embed_codec(self, ids):
        return self.codec_embedding(torch.as_tensor(ids, dtype=torch.long))

    def embed_frame(self, codes):
        codes = torch.as_tensor(codes, dtype=torch.long)
        out = self.codec_embedding(codes[..., 0])
        for j, emb in enumerate(self.residual_embeddings):
            out = out + emb(codes[..., j + 1])
        return out


def padded_rows(n: int, least: int = 16) -> int:
    """``n`` rows rounded up to a power of two, at least ``least`` (the GPU projection's shapes)."""
    return max(least, 1 << max(0, n - 1).bit_length())


def load_prompt_embedder(checkpoint_dir: str, config: Qwen3TTSConfig, dtype=torch.float32) -> PromptEmbedder:
    from safetensors import safe_open

    path = os.path.join(checkpoint_dir, "model.safetensors")
    if not os.path.exists(path):
        raise FileNotFoundError(f"missing file: {path}")
    with torch.device("meta"):
        emb = PromptEmbedder(config)
    expected = dict(emb.state_dict())
    sd = {}
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        for ck, ours in PromptEmbedder.key_map(config).items():
            if ck not in keys:
                raise KeyError(f"{path}: missing tensor {ck}")
            t = f.get_tensor(ck)
            if tuple(t.shape) != tuple(expected[ours].shape):
                raise ValueError(f"{path}: {ck} has shape {tuple(t.shape)}, expected {tuple(expected[ours].shape)}")
            sd[ours] = t.to(dtype)
    emb.load_state_dict(sd, strict=True, assign=True)
    return emb.eval()


@dataclass
class BuiltPrompt:
    layout: PromptLayout
    prompt_embeds: torch.Tensor  # [L, D]
    trailing: torch.Tensor  # [N, D]
    tts_pad: torch.Tensor  # [D]


class PromptFrontend:
    """Tokenizer + prompt builder + embedding tables of one checkpoint."""

    def __init__(self, checkpoint_dir: str, dtype=torch.float32, project_device: str = "cpu"):
        from triton_qwen3_tts.model.text import load_text_tokenizer

        self.checkpoint_dir = checkpoint_dir
        self.config = Qwen3TTSConfig.from_file(os.path.join(checkpoint_dir, "config.json"))
        self.tokenizer = load_text_tokenizer(checkpoint_dir)
        self.embedder = load_prompt_embedder(checkpoint_dir, self.config, dtype).project_on(project_device)
        with torch.inference_mode():
            self._tts_pad = self.embedder.embed_text([self.config.tts_pad_token_id])[0].clone()

    def validate(self, req: PromptRequest) -> PromptRequest:
        return validate_request(self.config, req)

    @torch.inference_mode()
    def build(self, req: PromptRequest, speaker_vector: Optional[np.ndarray] = None) -> BuiltPrompt:
        layout = build_prompt(self.config, self.tokenizer, req)
        sv = None if speaker_vector is None else torch.as_tensor(speaker_vector, dtype=self._tts_pad.dtype)
        prompt, trailing = embed_prompt(layout, self.embedder, sv)
        return BuiltPrompt(layout, prompt, trailing, self._tts_pad)
