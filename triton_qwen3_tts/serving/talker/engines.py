"""Build the talker's prompt front end and engine from the `talker` model settings."""

from __future__ import annotations

import os

from triton_qwen3_tts.serving.model_config import TalkerModelConfig


def make_frontend(cfg: TalkerModelConfig):
    from triton_qwen3_tts.model.frontend import PromptFrontend

    return PromptFrontend(cfg.checkpoint)


async def make_engine(cfg: TalkerModelConfig):
    """Start the configured engine (``vllm`` or ``native``) and return it."""
    if cfg.engine == "vllm":
        if cfg.device == "cpu":
            # vLLM-CPU inside one Triton stub: no extra worker process, no core pinning.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from triton_qwen3_tts.engines.vllm.engine import EngineConfig, TalkerEngine

        ec = EngineConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_model_len=cfg.max_model_len,
            kv_cache_memory_bytes=cfg.kv_cache_memory_bytes or None,
            enforce_eager=cfg.enforce_eager,
            dtype=cfg.dtype,
            seed=cfg.seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
        )
        return await TalkerEngine.create(cfg.checkpoint, ec)
    from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig

    extra = {}
    if cfg.batch_buckets():
        extra["batch_buckets"] = cfg.batch_buckets()
    return await NativeEngine.create(
        cfg.checkpoint,
        NativeEngineConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_model_len=cfg.max_model_len,
            device=cfg.device,
            dtype=cfg.dtype,
            cuda_graphs=not cfg.enforce_eager,
            seed=cfg.seed,
            compile=cfg.native_compile and cfg.device == "cuda",
            **extra,
        ),
    )
