"""Write a ready Triton model repository from the templates in ``model_repository/``.

``scripts/build_model_repository.py`` is the command-line front end. The templates hold
``${name}`` placeholders; every placeholder must be filled (an unfilled one fails the build with
its name), and the result is validated by parsing it back (``parameters`` round-trip through the
same typed configs the models use at load time).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import string
from dataclasses import asdict, dataclass
from typing import Dict

from triton_qwen3_tts.model.config import Qwen3TTSConfig

TEMPLATES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "model_repository"
)


class RepositoryError(ValueError):
    pass


@dataclass
class RepositorySettings:
    checkpoint: str
    codec_backend: str = "tensorrt"  # tensorrt | python
    device: str = "gpu"  # gpu | cpu
    engine: str = "vllm"  # vllm | native
    plan: str = ""  # TensorRT plan to copy in (codec_backend tensorrt)
    # talker engine
    talker_dtype: str = ""  # default: bfloat16 on gpu, float32 on cpu
    max_num_seqs: int = 64
    # talker context (prompt + frames) per request; 0: sized from the tts limits below so that every
    # request they allow fits (talker_context). An explicit value smaller than that fails the build.
    max_model_len: int = 0
    kv_cache_memory_bytes: int = 0
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False
    native_compile: bool = False  # engine native, GPU: torch.compile the layer blocks before capture
    native_batch_buckets: str = ""  # engine native: decode batch buckets, e.g. "1,8,32,64"
    # codec
    codec_runtime: str = "torch"  # torch | onnxruntime (python backend only)
    codec_onnx_path: str = ""
    codec_dtype: str = "float32"
    codec_cuda_graphs: bool = True
    codec_max_batch_size: int = 64
    codec_queue_delay_us: int = 1000
    codec_instances: int = 1
    codec_frame_buckets: str = ""
    codec_max_frames: int = 512
    codec_mode: str = (
        "windowed"  # windowed | stateful (codec_decoder_stateful instead of codec_decoder; tts left context 0)
    )
    # stateful codec on GPU: CUDA-graph frame counts ("" = the chunk schedule's sizes plus 1)
    codec_stateful_frame_buckets: str = ""
    # codec_mode stateful: codec_decoder_stateful on the Python backend (torch; CUDA graphs on GPU) or
    # a TensorRT plan (export/build_trt_engine.py --stateful), then the tts sends zero state first
    codec_stateful_backend: str = "python"  # python | tensorrt
    stateful_plan: str = ""  # TensorRT plan of the stateful codec (codec_stateful_backend tensorrt)
    # codec_mode stateful: where a stream's state lives between chunks. "resident": inside the
    # Python-backend codec, by stream id (the tts sends only frames); "request": it travels with
    # every chunk as state tensors (the TensorRT plan's only way). "" = resident on python,
    # request on tensorrt.
    codec_state: str = ""
    codec_state_slots: int = 0  # state resident: slots; 0 = 2 x max_in_flight x tts_instances
    codec_state_idle_timeout_s: float = 300.0  # state resident: release streams idle this long (0: never)
    # tts
    default_speaker: str = ""
    default_max_frames: int = 2048
    max_frames_limit: int = 4096
    max_text_chars: int = 2000  # text and ref_text, in characters
    max_instruct_chars: int = 1000
    first_chunk_frames: int = 2
    chunk_ramp: str = "4,8,16"
    chunk_frames: int = 25
    left_context_frames: int = 72
    max_in_flight: int = 64  # per tts instance
    max_queued: int = 64  # per tts instance
    request_deadline_s: float = 60.0  # a tts request without progress this long fails (UNAVAILABLE)
    # tts stub processes: each drives its streams' chunk loops and BLS calls on its own core (Triton
    # spreads requests over them); admission limits and the voice cache are per instance
    tts_instances: int = 1
    voice_cache_size: int = 256  # Base checkpoints: reference voices kept by voice_id (0: none)

    def validate(self) -> None:
        for name, allowed in (
            ("codec_backend", ("tensorrt", "python")),
            ("device", ("gpu", "cpu")),
            ("engine", ("vllm", "native")),
            ("codec_runtime", ("torch", "onnxruntime")),
            ("codec_mode", ("windowed", "stateful")),
            ("codec_stateful_backend", ("python", "tensorrt")),
        ):
            if getattr(self, name) not in allowed:
                raise RepositoryError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.tts_instances, int) or isinstance(self.tts_instances, bool) or self.tts_instances < 1:
            raise RepositoryError(f"tts_instances must be an int >= 1, got {self.tts_instances!r}")
        if self.codec_backend == "tensorrt" and self.device == "cpu":
            raise RepositoryError("codec_backend tensorrt needs device gpu (use --codec-backend python on CPU)")
        if self.codec_backend == "tensorrt" and self.plan and not os.path.exists(self.plan):
            raise RepositoryError(
                f"TensorRT plan {self.plan} does not exist (build it with export/build_trt_engine.py)"
            )
        if self.codec_state not in ("", "request", "resident"):
            raise RepositoryError(
                f"codec_state must be one of resident, request (or empty: resident on the python "
                f"backend, request on tensorrt), got {self.codec_state!r}"
            )
        if not isinstance(self.codec_state_slots, int) or self.codec_state_slots < 0:
            raise RepositoryError(
                f"codec_state_slots must be an int >= 0 (0: 2 x max_in_flight x tts_instances), "
                f"got {self.codec_state_slots!r}"
            )
        if (
            not isinstance(self.codec_state_idle_timeout_s, (int, float))
            or not 0 <= self.codec_state_idle_timeout_s <= 86400
        ):
            raise RepositoryError(
                f"codec_state_idle_timeout_s must be in [0, 86400] seconds (0: never), "
                f"got {self.codec_state_idle_timeout_s!r}"
            )
        if self.codec_stateful_backend == "tensorrt":
            if self.codec_state == "resident":
                raise RepositoryError(
                    "codec_state resident needs codec_stateful_backend python (a TensorRT plan "
                    "takes the state as request tensors: codec_state request)"
                )
            if self.codec_mode != "stateful":
                raise RepositoryError("codec_stateful_backend tensorrt needs codec_mode stateful")
            if self.device == "cpu":
                raise RepositoryError(
                    "codec_stateful_backend tensorrt needs device gpu (use --codec-stateful-backend python on CPU)"
                )
            if not self.stateful_plan or not os.path.isfile(self.stateful_plan):
                raise RepositoryError(
                    f"codec_stateful_backend tensorrt needs --stateful-plan, the stateful codec's "
                    f"TensorRT plan (export/build_trt_engine.py --stateful); got "
                    f"{self.stateful_plan or 'none'!r}" + (" (no such file)" if self.stateful_plan else "")
                )
        for name in ("max_frames_limit", "max_text_chars", "max_instruct_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RepositoryError(f"{name} must be an int >= 1, got {v!r}")
        if not 1 <= self.default_max_frames <= self.max_frames_limit:
            raise RepositoryError(
                f"default_max_frames must be in [1, max_frames_limit={self.max_frames_limit}], "
                f"got {self.default_max_frames}"
            )
        if not isinstance(self.max_model_len, int) or self.max_model_len < 0:
            raise RepositoryError(
                f"max_model_len must be an int >= 0 (0: sized from the limits), got {self.max_model_len!r}"
            )
        if not os.path.isfile(os.path.join(self.checkpoint, "config.json")):
            raise RepositoryError(f"{self.checkpoint} is not a checkpoint directory (no config.json)")


# TalkerModelConfig's range for max_model_len
MAX_MODEL_LEN_LIMIT = 32768


@dataclass(frozen=True)
class TalkerContext:
    """The talker context a repository needs (see :func:`talker_context`)."""

    max_model_len: int  # what the talker gets
    required: int  # max_frames_limit + max_prompt_rows + 1
    max_prompt_rows: int
    max_ref_frames: int
    warning: str = ""  # the talker will not load as built (vLLM: beyond max_position_embeddings)


def max_ref_frames(ref_max_seconds: float) -> int:
    """Reference codes of the longest reference audio: ``ceil(samples / 1920)`` at 24 kHz, +1 for
    the resampler's rounding (codec_encoder.encode_reference)."""
    return math.ceil(ref_max_seconds * 24000 / 1920) + 1


def talker_context(s: RepositorySettings, cfg: Qwen3TTSConfig) -> TalkerContext:
    """Size the talker's ``max_model_len`` so that every request the tts limits allow is served.

    A request needs ``prompt rows + max_frames + 1`` positions (engine.check_prompt_frames_trailing).
    The longest prompt follows from the prompt layout and the tokenizer's worst case, at most 4
    tokens per character (prompt.max_prompt_rows: byte-level BPE, <= one token per UTF-8 byte), for
    ``max_text_chars`` / ``max_instruct_chars`` / a ``ref_max_seconds`` reference of this checkpoint's
    task type. So ``required = max_frames_limit + max_prompt_rows + 1``; ``max_model_len`` 0 takes
    it. Memory: vLLM's KV cache is a pool sized by kv_cache_memory_bytes / gpu_memory_utilization,
    of which one request may use up to max_model_len positions; the native engine reserves
    max_model_len positions for each of its max_num_seqs slots (see kv_cache_bytes)."""
    from triton_qwen3_tts.model.prompt import max_prompt_rows
    from triton_qwen3_tts.serving.model_config import TtsModelConfig

    ref_frames = max_ref_frames(TtsModelConfig.ref_max_seconds)
    rows = max_prompt_rows(cfg, s.max_text_chars, s.max_instruct_chars, s.max_text_chars, ref_frames)
    required = s.max_frames_limit + rows + 1
    limits = (
        f"--max-frames-limit {s.max_frames_limit}, --max-text-chars {s.max_text_chars}, "
        f"--max-instruct-chars {s.max_instruct_chars}"
    )
    why = (
        f"a {cfg.task_type} request may ask for {s.max_frames_limit} frames after a prompt of up to "
        f"{rows} rows (at most 4 tokens per character), so the talker needs max_model_len >= {required}"
    )
    lower = "lower --max-frames-limit / --max-text-chars / --max-instruct-chars"
    if s.max_model_len and s.max_model_len < required:
        raise RepositoryError(
            f"--max-model-len {s.max_model_len} is too small for the tts limits ({limits}): "
            f"{why}. Raise --max-model-len to at least {required} (or leave it 0: sized "
            f"from the limits), or {lower}"
        )
    mml = s.max_model_len or required
    if mml > MAX_MODEL_LEN_LIMIT:
        fix = lower if required > MAX_MODEL_LEN_LIMIT else f"lower --max-model-len to {required}..{MAX_MODEL_LEN_LIMIT}"
        raise RepositoryError(
            f"max_model_len {mml} is more than {MAX_MODEL_LEN_LIMIT}, the talker's largest; "
            f"{why} ({limits}). {fix[0].upper()}{fix[1:]}"
        )
    warning = ""
    pos = cfg.talker.max_position_embeddings
    if s.engine == "vllm" and mml > pos:
        # not an error: a repository of a small test checkpoint may be built for other reasons
        warning = (
            f"max_model_len {mml} is more than the checkpoint's max_position_embeddings {pos}: vLLM will "
            f"refuse to load the talker; {why} ({limits}). To serve it, {lower}"
        )
    return TalkerContext(mml, required, rows, ref_frames, warning)


def kv_cache_bytes(s: RepositorySettings, cfg: Qwen3TTSConfig, max_model_len: int) -> int:
    """Talker KV cache of the native engine: ``max_num_seqs + 1`` slots of ``max_model_len``
    positions (native_engine.py). vLLM's pool is sized on its own (kv_cache_memory_bytes /
    gpu_memory_utilization) and need only hold one request of ``max_model_len`` positions."""
    t = cfg.talker
    dtype = s.talker_dtype or ("float32" if s.device == "cpu" else "bfloat16")
    size = 4 if dtype == "float32" else 2
    return (s.max_num_seqs + 1) * max_model_len * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * size


def codec_state(s: RepositorySettings) -> str:
    """The effective ``codec_state``: as set, or resident on the python backend, request on tensorrt."""
    return s.codec_state or ("request" if s.codec_stateful_backend == "tensorrt" else "resident")


def stateful_frame_buckets(s: RepositorySettings) -> str:
    """``codec_stateful_frame_buckets`` or, when empty, the new-frame counts the tts sends in
    stateful mode: first chunk, ramp, chunk (its reference-code priming uses chunk-sized pieces)
    plus 1. Validated like the model validates it at load time."""
    from triton_qwen3_tts.serving.model_config import ModelConfigError, check_stateful_frame_buckets

    text = s.codec_stateful_frame_buckets.strip()
    try:
        if text:
            vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
        else:
            ramp = tuple(int(x) for x in s.chunk_ramp.replace(" ", "").split(",") if x)
            vals = tuple(sorted({1, s.first_chunk_frames, s.chunk_frames, *ramp}))
        check_stateful_frame_buckets(vals, s.codec_max_frames)
    except (ValueError, ModelConfigError) as e:
        raise RepositoryError(f"codec_stateful_frame_buckets: {e}") from None
    return ",".join(str(v) for v in vals)


def _substitute(text: str, values: Dict[str, str], where: str) -> str:
    try:
        out = string.Template(text).substitute(values)
    except KeyError as e:
        raise RepositoryError(f"{where}: placeholder ${{{e.args[0]}}} has no value") from None
    left = re.findall(r"\$\{(\w+)\}", out)
    if left:
        raise RepositoryError(f"{where}: unfilled placeholder(s) {left}")
    return out


def build_repository(s: RepositorySettings, out_dir: str, templates: str = TEMPLATES) -> str:
    """Write the repository to ``out_dir`` (replaced if it exists); return its path."""
    s.validate()
    ckpt = os.path.abspath(s.checkpoint)
    cfg = Qwen3TTSConfig.from_file(os.path.join(ckpt, "config.json"))
    default_speaker = s.default_speaker or (cfg.speakers[0] if cfg.speakers else "")
    if default_speaker and default_speaker not in cfg.speakers:
        raise RepositoryError(
            f"default_speaker {default_speaker!r} is not a speaker of this checkpoint; "
            f"speakers: {', '.join(cfg.speakers) or '(none)'}"
        )
    ctx = talker_context(s, cfg)
    cpu = s.device == "cpu"
    frame_buckets = s.codec_frame_buckets
    if not frame_buckets and s.codec_backend == "tensorrt":
        first = s.first_chunk_frames
        frame_buckets = ",".join(str(x) for x in sorted({first, 8, 16, 32, 64, s.chunk_frames + s.left_context_frames}))
    values = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in asdict(s).items()}
    values.update(
        checkpoint=ckpt,
        max_model_len=str(ctx.max_model_len),
        device="cpu" if cpu else "cuda",
        talker_dtype=s.talker_dtype or ("float32" if cpu else "bfloat16"),
        codec_instance_kind="KIND_CPU" if cpu else "KIND_GPU",
        codec_cuda_graphs=str(s.codec_cuda_graphs and not cpu).lower(),
        codec_frame_buckets=frame_buckets,
        codec_preferred_batch_sizes=", ".join(str(b) for b in (8, 16, 32, 64) if b <= s.codec_max_batch_size)
        or str(s.codec_max_batch_size),
        default_speaker=default_speaker,
        tts_codec_model="codec_decoder",
        codec_zero_state_start="false",
        codec_state="request",
        codec_state_slots=str(s.codec_state_slots or 2 * s.max_in_flight * s.tts_instances),
        codec_codes_optional="false",
        codec_stateful_instance_kind="KIND_CPU" if cpu else "KIND_GPU",
        codec_state_outputs_tail="",
    )
    stateful = s.codec_mode == "stateful"
    if stateful:
        from triton_qwen3_tts.serving.codec.stateful import (
            config_io_blocks,
            state_specs_from_checkpoint,
            trt_config_io_blocks,
        )

        specs = state_specs_from_checkpoint(ckpt)
        mode = codec_state(s)
        if s.codec_stateful_backend == "tensorrt":
            ins, outs = trt_config_io_blocks(specs)
            values.update(codec_zero_state_start="true")
        elif mode == "resident":
            ins = (
                '  { name: "stream_id" data_type: TYPE_UINT64 dims: [ 1 ] },\n'
                '  { name: "end" data_type: TYPE_BOOL dims: [ 1 ] optional: true }'
            )
            outs = ""
            values.update(codec_codes_optional="true", codec_stateful_instance_kind="KIND_CPU" if cpu else "KIND_MODEL")
        else:
            ins, outs = config_io_blocks(specs, s.codec_dtype)
        values.update(
            codec_state_inputs=ins,
            codec_state_outputs=outs,
            codec_state=mode,
            codec_state_outputs_tail=(",\n" + outs) if outs else "",
            left_context_frames="0",
            tts_codec_model="codec_decoder_stateful",
            codec_stateful_frame_buckets=stateful_frame_buckets(s),
        )
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    models = {
        "talker": "talker",
        "tts": "tts",
        "codec_decoder": "codec_decoder" if s.codec_backend == "tensorrt" else "codec_decoder_python",
    }
    if stateful:
        # the tts then talks to codec_decoder_stateful only: loading the windowed codec as well
        # would hold its CUDA graphs (tens of GB at batch 64 x 97 frames) for nothing
        del models["codec_decoder"]
        models["codec_decoder_stateful"] = (
            "codec_stateful_trt" if s.codec_stateful_backend == "tensorrt" else "codec_stateful_python"
        )
    for name, src in models.items():
        src_dir = os.path.join(templates, src)
        dst_dir = os.path.join(out_dir, name, "1")
        os.makedirs(dst_dir)
        with open(os.path.join(src_dir, "config.pbtxt.in"), encoding="utf-8") as f:
            text = _substitute(f.read(), values, f"{src}/config.pbtxt.in")
        with open(os.path.join(out_dir, name, "config.pbtxt"), "w", encoding="utf-8") as f:
            f.write(text)
        model_py = os.path.join(src_dir, "1", "model.py")
        if os.path.exists(model_py):
            shutil.copy2(model_py, os.path.join(dst_dir, "model.py"))
    if s.codec_backend == "tensorrt" and not stateful:
        plan = s.plan or os.path.join(templates, "codec_decoder", "1", "model.plan")
        if not os.path.exists(plan):
            raise RepositoryError(
                f"no TensorRT plan at {plan}: build it with export/build_trt_engine.py "
                "or pass --plan (or use --codec-backend python)"
            )
        shutil.copy2(plan, os.path.join(out_dir, "codec_decoder", "1", "model.plan"))
    if stateful and s.codec_stateful_backend == "tensorrt":
        shutil.copy2(s.stateful_plan, os.path.join(out_dir, "codec_decoder_stateful", "1", "model.plan"))
    with open(os.path.join(out_dir, "build.json"), "w") as f:
        json.dump(
            {
                "settings": asdict(s),
                "checkpoint_task_type": cfg.task_type,
                "talker_context": {**asdict(ctx), "native_kv_cache_bytes": kv_cache_bytes(s, cfg, ctx.max_model_len)},
            },
            f,
            indent=2,
        )
    return out_dir
