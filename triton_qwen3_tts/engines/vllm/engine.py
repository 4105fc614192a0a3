"""TalkerEngine: the Qwen3-TTS talker served by vLLM 0.32 ``AsyncLLM`` (design: docs/design/talker-vllm.md).

``TalkerEngine(checkpoint_dir, EngineConfig)`` turns a prompt (``prompt_embeds [L, D]`` and the
trailing text rows ``[N, D]`` from :func:`triton_qwen3_tts.model.prompt.embed_prompt`) into a stream of
codec frames, ``np.ndarray [n, 16] int32`` chunks.

vLLM never sees the official ``config.json`` (``model_type: qwen3_tts`` is unknown to
``AutoConfig``): :func:`prepare_vllm_model_dir` writes a derived directory with a Qwen3-compatible
``config.json`` (architecture ``Qwen3TTSTalkerForVLLM``) and a symlink to the checkpoint's
``model.safetensors``. The checkpoint directory itself is never written.

Processes: ``AsyncLLM`` always runs EngineCore in a child process, so the model class is
registered through the ``vllm.general_plugins`` entry point (:mod:`.plugin`). Scripts that
start an engine need ``if __name__ == "__main__":`` (vLLM-CPU uses ``spawn``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Optional

import numpy as np

from triton_qwen3_tts.engines.base import (
    NUM_CHANNEL,
    SUPPRESS_START,
    EngineError,
    TalkerRequest,
    check_prompt_frames_trailing,
    check_sampling_fields,
)
from triton_qwen3_tts.model.config import ConfigError, Qwen3TTSConfig

__all__ = [
    "EngineConfig",
    "EngineError",
    "TalkerRequest",
    "TalkerEngine",
    "prepare_vllm_model_dir",
    "DERIVED_FORMAT_VERSION",
]

DERIVED_FORMAT_VERSION = 1


_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """vLLM settings of the talker engine; validated on construction.

    ``kv_cache_memory_bytes`` sizes the paged KV cache explicitly (required on CPU, where the
    memory-utilisation check reads NUMA node 0); ``None`` uses ``gpu_memory_utilization``.
    ``max_trailing_tokens``: rows of trailing text a request may carry (device table
    ``[max_num_seqs, max_trailing_tokens, D]``).
    """

    max_num_seqs: int = 8
    max_model_len: int = 2048
    kv_cache_memory_bytes: Optional[int] = 64 * 2**20
    enforce_eager: bool = True
    dtype: str = "bfloat16"
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: Optional[int] = None
    max_trailing_tokens: int = 512
    model_cache_dir: Optional[str] = None

    def __post_init__(self):
        def bad(field, msg):
            raise EngineError(f"EngineConfig.{field}: {msg}")

        for f in ("max_num_seqs", "max_model_len", "max_trailing_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(f, f"must be a positive int, got {v!r}")
        if self.max_model_len < 3:
            bad("max_model_len", "must be >= 3 (prompt + at least one frame)")
        if self.kv_cache_memory_bytes is not None and (
            not isinstance(self.kv_cache_memory_bytes, int) or self.kv_cache_memory_bytes <= 0
        ):
            bad("kv_cache_memory_bytes", f"must be a positive int or None, got {self.kv_cache_memory_bytes!r}")
        if self.dtype not in _DTYPES:
            bad("dtype", f"{self.dtype!r}; allowed: {', '.join(_DTYPES)}")
        if not isinstance(self.enforce_eager, bool):
            bad("enforce_eager", "must be a bool")
        if not isinstance(self.seed, int) or self.seed < 0:
            bad("seed", f"must be a non-negative int, got {self.seed!r}")
        if not (0.0 < float(self.gpu_memory_utilization) <= 1.0):
            bad("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.max_num_batched_tokens is not None:
            if not isinstance(self.max_num_batched_tokens, int) or self.max_num_batched_tokens < self.max_num_seqs:
                bad("max_num_batched_tokens", f"must be an int >= max_num_seqs, got {self.max_num_batched_tokens!r}")


def _talker_json(checkpoint_dir: Path) -> tuple[dict, Qwen3TTSConfig]:
    path = checkpoint_dir / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"missing file: {path}") from None
    return raw, Qwen3TTSConfig.from_dict(raw)


def derived_config(raw: dict, cfg: Qwen3TTSConfig, max_trailing_tokens: int) -> dict:
    """The Qwen3-compatible ``config.json`` vLLM reads (design section 6.1)."""
    t = raw["talker_config"]
    tc = cfg.talker
    cp = tc.code_predictor
    return {
        "architectures": ["Qwen3TTSTalkerForVLLM"],
        "model_type": "qwen3",
        "vocab_size": tc.vocab_size + NUM_CHANNEL,
        "hidden_size": tc.hidden_size,
        "intermediate_size": tc.intermediate_size,
        "num_hidden_layers": tc.num_hidden_layers,
        "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads,
        "head_dim": tc.head_dim,
        "hidden_act": t.get("hidden_act", "silu"),
        "rms_norm_eps": tc.rms_norm_eps,
        # identical M-RoPE streams == plain 1-D RoPE, bit for bit
        "rope_theta": tc.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": tc.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "eos_token_id": tc.codec_eos_token_id,
        "torch_dtype": "bfloat16",
        "qwen3_tts": {
            "format_version": DERIVED_FORMAT_VERSION,
            "codec_vocab_size": tc.vocab_size,
            "codec_eos_token_id": tc.codec_eos_token_id,
            "suppress_start": SUPPRESS_START,
            "tts_pad_token_id": cfg.tts_pad_token_id,
            "max_trailing_tokens": max_trailing_tokens,
            "code_predictor": {
                "hidden_size": cp.hidden_size,
                "intermediate_size": cp.intermediate_size,
                "num_hidden_layers": cp.num_hidden_layers,
                "num_attention_heads": cp.num_attention_heads,
                "num_key_value_heads": cp.num_key_value_heads,
                "head_dim": cp.head_dim,
                "rms_norm_eps": cp.rms_norm_eps,
                "rope_theta": cp.rope_theta,
                "vocab_size": cp.vocab_size,
                "num_code_groups": cp.num_code_groups,
            },
        },
    }


CACHE_ENV = "QWEN3_TTS_CACHE"


def cache_root() -> Path:
    """The project's cache folder: ``$QWEN3_TTS_CACHE``, else ``~/.cache/triton_qwen3_tts``. The
    derived model folders vLLM loads go to its ``vllm/`` (a few KB each: a config and a symlink)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "triton_qwen3_tts").expanduser()


def prepare_vllm_model_dir(checkpoint_dir, cache_dir=None, max_trailing_tokens: int = 512) -> Path:
    """Write (once) the derived model dir vLLM loads, under ``cache_dir`` or ``cache_root()/vllm``;
    returns its path."""
    ck = Path(checkpoint_dir).resolve()
    raw, cfg = _talker_json(ck)
    st = ck / "model.safetensors"
    if not st.exists():
        raise ConfigError(f"missing file: {st}")
    dcfg = derived_config(raw, cfg, max_trailing_tokens)
    stat = st.stat()
    key = hashlib.sha256(
        json.dumps([str(ck), dcfg, stat.st_size, stat.st_mtime_ns], sort_keys=True).encode()
    ).hexdigest()[:16]
    base = Path(cache_dir) if cache_dir else cache_root() / "vllm"
    out = base / key
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(dcfg, indent=2), encoding="utf-8")
    os.replace(tmp, out / "config.json")
    link = out / "model.safetensors"
    if not (link.is_symlink() and os.readlink(link) == str(st)):
        if link.exists() or link.is_symlink():
            link.unlink()
        os.symlink(st, link)
    return out


class TalkerEngine:
    """Async talker engine. Use ``engine = await TalkerEngine.create(ckpt, cfg)`` or
    ``TalkerEngine(ckpt, cfg)`` followed by ``await engine.start()``."""

    def __init__(self, checkpoint_dir, config: EngineConfig = EngineConfig()):
        if not isinstance(config, EngineConfig):
            raise EngineError("config must be an EngineConfig")
        self.checkpoint_dir = Path(checkpoint_dir)
        self.config = config
        raw, self.tts_config = _talker_json(self.checkpoint_dir)
        tc = self.tts_config.talker
        self.hidden = tc.hidden_size
        self.codec_vocab = tc.vocab_size
        self.eos = tc.codec_eos_token_id
        self.channel_ids = list(range(self.codec_vocab, self.codec_vocab + NUM_CHANNEL))
        self.llm = None
        self._torch_dtype = None
        # engine index -> last SchedulerStats seen (filled by _SchedulerProbe, see scheduler_state)
        self._sched_stats: dict = {}
        self._sched_steps = 0

    @classmethod
    async def create(cls, checkpoint_dir, config: EngineConfig = EngineConfig()) -> "TalkerEngine":
        eng = cls(checkpoint_dir, config)
        await eng.start()
        return eng

    async def start(self) -> None:
        if self.llm is not None:
            return
        # The project decision (docs/design/talker-vllm.md): MRV1 on every platform.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from triton_qwen3_tts.engines.vllm.model import TalkerSlotProcessor

        c = self.config
        self._torch_dtype = getattr(torch, c.dtype)
        model_dir = prepare_vllm_model_dir(self.checkpoint_dir, c.model_cache_dir, c.max_trailing_tokens)
        kw = dict(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype=c.dtype,
            max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs,
            enforce_eager=c.enforce_eager,
            seed=c.seed,
            gpu_memory_utilization=c.gpu_memory_utilization,
            enable_prompt_embeds=True,
            enable_prefix_caching=False,
            logprobs_mode="raw_logits",
            generation_config="vllm",
            logits_processors=[TalkerSlotProcessor],
            worker_extension_cls="triton_qwen3_tts.engines.vllm.model.TalkerWorkerExtension",
        )
        if c.kv_cache_memory_bytes is not None:
            kw["kv_cache_memory_bytes"] = c.kv_cache_memory_bytes
        if c.max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = c.max_num_batched_tokens
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw), stat_loggers=[self._scheduler_probe_factory()])

    # -- requests -------------------------------------------------------------------------
    def check_request(self, req: TalkerRequest):
        """Refuse what cannot run, before anything is scheduled. Returns (embeds, trailing)."""
        c = self.config
        out = check_prompt_frames_trailing(req, self.hidden, c.max_model_len, c.max_trailing_tokens)
        # any top-k: codebook-0 and residual sampling see their whole vocabularies
        check_sampling_fields(req, self.codec_vocab, self.tts_config.talker.code_predictor.vocab_size)
        return out

    def sampling_params(self, req: TalkerRequest, prompt_len: int, trailing):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sub_greedy = req.greedy if req.sub_greedy is None else req.sub_greedy
        sub_seed = req.seed if req.seed is not None else secrets.randbits(63)
        tr = np.ascontiguousarray(trailing.detach().float().cpu().numpy(), dtype=np.float32)
        extra = {
            "qwen3_tts": {
                "prompt_len": int(prompt_len),
                "n_trailing": int(tr.shape[0]),
                "dim": self.hidden,
                "trailing": tr.tobytes(),
                "sub_temperature": float(req.sub_temperature),
                "sub_top_k": int(req.sub_top_k),
                "sub_top_p": float(req.sub_top_p),
                "sub_greedy": bool(sub_greedy),
                "sub_seed": int(sub_seed) & ((1 << 63) - 1),
                "repetition_penalty": float(req.repetition_penalty),
            }
        }
        extra["qwen3_tts"].update(
            {
                "greedy": bool(req.greedy),
                "temperature": float(req.temperature),
                "top_k": int(req.top_k),
                "top_p": float(req.top_p),
                "seed": int(sub_seed) & ((1 << 63) - 1),
                "min_new_tokens": int(req.min_new_tokens),
                "suppress_eos": bool(req.suppress_eos),
            }
        )
        # vLLM only takes the argmax: codebook-0 sampling happens in TalkerSlotProcessor.apply
        # (design section 3), so vLLM never creates a torch generator for a talker request.
        kw = dict(
            n=1,
            max_tokens=req.max_frames + 1,
            logprob_token_ids=self.channel_ids,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            extra_args=extra,
            skip_special_tokens=False,
            temperature=0.0,
        )
        if req.suppress_eos:
            kw["ignore_eos"] = True
        else:
            kw["stop_token_ids"] = [self.eos]
        return SamplingParams(**kw)

    async def synthesize(self, req: TalkerRequest) -> AsyncIterator[np.ndarray]:
        """Yield frames ``[n, 16] int32`` as they are produced (EOS frame never included)."""
        from triton_qwen3_tts.engines.vllm.model import STATUS_FRAME, decode_channel

        if self.llm is None:
            raise EngineError("engine not started (await engine.start())")
        pe, tr = self.check_request(req)
        sp = self.sampling_params(req, pe.shape[0], tr)
        pe = pe.to(self._torch_dtype).contiguous()
        prev_c0 = None
        ch_ids = self.channel_ids
        async for out in self.llm.generate({"prompt_embeds": pe}, sp, request_id=req.request_id):
            o = out.outputs[0]
            frames = []
            for tok, lp in zip(o.token_ids, o.logprobs or []):
                vals = decode_channel([lp[i].logprob for i in ch_ids])
                if vals[0] == STATUS_FRAME:
                    if prev_c0 is None:
                        raise RuntimeError(f"{req.request_id}: frame before the first codebook-0 token")
                    frames.append([prev_c0, *vals[1:].tolist()])
                prev_c0 = int(tok)
            if frames:
                yield np.asarray(frames, dtype=np.int32)

    async def abort(self, request_id: str) -> None:
        if self.llm is not None:
            await self.llm.abort(request_id)

    async def side_state_stats(self, collect: bool = False) -> list:
        """Per-worker slot-table stats (tests, monitoring); ``collect`` runs the cyclic GC first."""
        return await self.llm.collective_rpc("tts_side_state_stats", args=(collect,))

    def _scheduler_probe_factory(self):
        """A vLLM per-engine stat-logger factory that keeps the scheduler's latest stats.

        EngineCore (scheduler, KV block pool) lives in a child process; vLLM attaches a
        ``SchedulerStats`` (running / waiting queue lengths, KV block usage) to the outputs of
        every engine step, and the frontend hands it to the stat loggers synchronously, before
        the step's request outputs reach ``synthesize``'s consumer."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        eng = self

        class _SchedulerProbe(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                self.engine_index = engine_index

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                if scheduler_stats is not None:
                    eng._sched_stats[engine_idx] = scheduler_stats
                    eng._sched_steps += 1

            def log_engine_initialized(self):
                pass

        return lambda vllm_config, engine_index: _SchedulerProbe(vllm_config, engine_index)

    def scheduler_state(self) -> dict:
        """vLLM's scheduler and KV block pool as of the engine's **last step** (tests, monitoring).

        ``running`` / ``waiting`` (incl. deferred): the scheduler's queue lengths;
        ``kv_blocks_total``: allocatable KV blocks (the pool minus vLLM's null block);
        ``kv_blocks_in_use`` = total - free; ``kv_cache_usage`` = in_use / total;
        ``steps``: scheduler reports seen so far (0: the engine has not stepped yet).
        The numbers are taken inside the engine core after the step's finished requests were
        freed. An engine core with no work does not step, so a request aborted while the engine
        is idle shows up only after the next step (run one more request to flush)."""
        if self.llm is None:
            raise EngineError("engine not started (await engine.start())")
        total = int(self.llm.vllm_config.cache_config.num_gpu_blocks or 0) - 1  # minus null block
        out = {
            "running": 0,
            "waiting": 0,
            "kv_cache_usage": 0.0,
            "kv_blocks_total": max(total, 0),
            "kv_blocks_in_use": 0,
            "steps": self._sched_steps,
        }
        for st in self._sched_stats.values():
            out["running"] += int(st.num_running_reqs)
            out["waiting"] += int(st.num_waiting_reqs) + int(st.num_skipped_waiting_reqs)
            out["kv_cache_usage"] = max(out["kv_cache_usage"], float(st.kv_cache_usage))
        # vLLM reports usage = 1 - free / total (BlockPool.get_usage); recover the block count
        out["kv_blocks_in_use"] = int(round(out["kv_cache_usage"] * out["kv_blocks_total"]))
        return out

    def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
