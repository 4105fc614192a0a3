"""Typed, validated settings of the Triton models, parsed once in ``initialize()``.

Triton hands a Python model its ``config.pbtxt`` as JSON; ``parameters`` arrive as
``{"key": {"string_value": "..."}}``. :func:`parameters_from_model_config` flattens them and each
``*ModelConfig.from_parameters`` turns them into a frozen dataclass. A bad or unknown value fails
the model load with a message naming the parameter and what is allowed; nothing is parsed again
on the hot path.
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, dataclass, fields
from typing import Any, Mapping, Optional, Tuple, Type, TypeVar

from triton_qwen3_tts.model.config import GenerationDefaults

from triton_qwen3_tts.serving.settings import BY_NAME, SettingError, choices, default, device_dtype, int_list
from triton_qwen3_tts.serving.tts.admission import AdmissionConfig
from triton_qwen3_tts.serving.tts.router import DeviceError, parse_gpus
from triton_qwen3_tts.serving.tts.request import SAMPLE_FORMATS, TASK_TYPES, Sampling, TtsLimits
from triton_qwen3_tts.serving.tts.voice import MAX_VOICE_CACHE_SIZE

T = TypeVar("T")

# New-frame counts of the tts chunk schedule (tts.chunks.ScheduleConfig defaults: first chunk 2,
# ramp 4/8/16, chunk 25) plus 1: the stateful codec's CUDA-graph frame buckets.
DEFAULT_STATEFUL_FRAME_BUCKETS = (1, 2, 4, 8, 16, 25)


# Where the stateful codec keeps a stream's state: sent with every request, or inside the model.
STATE_RESIDENCY = ("request", "resident")


class ModelConfigError(ValueError):
    pass


# pipeline fused: the tts model hosts the talker engine; its parameters carry the talker's
# settings under this prefix (serving/repository.py copies them from the talker's template)
ENGINE_PREFIX = "talker."


def parameters_from_model_config(model_config: Any) -> dict:
    """``args["model_config"]`` (JSON string or dict) -> {key: string value}."""
    cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
    out = {}
    for key, val in (cfg.get("parameters") or {}).items():
        out[key] = val.get("string_value", "") if isinstance(val, dict) else str(val)
    return out


def instance_count(model_config: Any) -> int:
    """How many instances Triton creates for a model config (dict or JSON): ``count`` per
    instance group, times the group's GPUs for KIND_GPU (Triton's normalized config lists every
    visible GPU there when the config names none)."""
    cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
    n = 0
    for g in cfg.get("instance_group") or [{}]:
        c = int(g.get("count", 1))
        if g.get("kind", "KIND_GPU") == "KIND_GPU":
            c *= max(1, len(g.get("gpus") or []))
        n += c
    return n


def _convert(name: str, raw: str, typ, default):
    s = raw.strip()
    try:
        if typ is bool or isinstance(default, bool):
            if s.lower() in ("1", "true", "yes", "on"):
                return True
            if s.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if typ is int or isinstance(default, int):
            return int(s)
        if typ is float or isinstance(default, float):
            return float(s)
        if isinstance(default, tuple):
            return int_list(s)
        return s
    except ValueError as e:
        raise ModelConfigError(f"parameter '{name}': cannot parse {raw!r} ({e})") from None


def _from_parameters(cls: Type[T], params: Mapping[str, str], ignore=()) -> T:
    known = {f.name: f for f in fields(cls)}
    unknown = set(params) - set(known) - set(ignore) - {"EXECUTION_ENV_PATH"}
    if unknown:
        raise ModelConfigError(f"unknown parameter(s) {sorted(unknown)}; known: {sorted(known)}")
    kw = {}
    for name, f in known.items():
        if name in params and params[name].strip() != "":
            default = f.default if f.default is not MISSING else None
            kw[name] = _convert(name, params[name], f.type if isinstance(f.type, type) else None, default)
        elif f.default is MISSING:
            raise ModelConfigError(f"parameter '{name}' is required")
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise ModelConfigError(str(e)) from None


def _check_gpu(gpu: int, device: str) -> None:
    if gpu < -1 or (gpu >= 0 and device != "cuda"):
        raise ModelConfigError(f"parameter 'gpu' must be -1 (default) or, on cuda, a GPU index >= 0; got {gpu}")


def _choice(name, value, allowed):
    if value not in allowed:
        raise ModelConfigError(f"parameter '{name}' must be one of {', '.join(allowed)}; got {value!r}")


def _allowed(name, value):
    """``value`` of setting ``name`` within its type and range (serving/settings.py), else a
    :class:`ModelConfigError` naming the parameter and what it allows."""
    try:
        BY_NAME[name].check(value)
    except SettingError as e:
        raise ModelConfigError(f"parameter '{name}'{str(e)[len(name) :]}") from None


def chunk_schedule_problem(first_chunk_frames: int, chunk_ramp, chunk_frames: int) -> Optional[Tuple[str, str]]:
    """The chunk sizes of a stream (serving/tts/chunks.py ScheduleConfig): the first chunk, then
    the ramp, then ``chunk_frames`` for ever; the first and every ramp entry in
    ``[1, chunk_frames]``. None when they are; else ``(noun, problem)``: the problem with the
    settings it concerns quoted by name, and ``"parameter"`` or ``"parameters"`` for a model's
    error to put before it (the repository builder's errors name settings without it)."""
    if not 1 <= first_chunk_frames <= chunk_frames:
        return "parameters", (
            f"'first_chunk_frames' ({first_chunk_frames}) and 'chunk_frames' ({chunk_frames}) need "
            "1 <= first_chunk_frames <= chunk_frames"
        )
    bad = [v for v in chunk_ramp if not 1 <= v <= chunk_frames]
    if bad:
        ramp = ",".join(str(v) for v in chunk_ramp)
        hint = (
            ": the ramp's chunks grow towards chunk_frames (drop the larger entries, or raise chunk_frames)"
            if max(bad) > chunk_frames
            else ""
        )
        return "parameter", (
            f"'chunk_ramp' ({ramp}) has {', '.join(str(v) for v in bad)} outside [1, chunk_frames={chunk_frames}]{hint}"
        )
    return None


def check_chunk_schedule(first_chunk_frames: int, chunk_ramp, chunk_frames: int) -> None:
    """:func:`chunk_schedule_problem` as a :class:`ModelConfigError` naming the parameters."""
    problem = chunk_schedule_problem(first_chunk_frames, chunk_ramp, chunk_frames)
    if problem is not None:
        raise ModelConfigError(" ".join(problem))


@dataclass(frozen=True)
class TalkerModelConfig:
    checkpoint: str
    engine: str = default("engine")  # vllm | native
    device: str = "cuda"  # cuda | cpu
    dtype: str = "bfloat16"  # bfloat16 | float16 | float32
    max_num_seqs: int = default("max_num_seqs")
    max_model_len: int = 4096
    kv_cache_memory_bytes: int = default("kv_cache_memory_bytes")  # 0: use gpu_memory_utilization
    gpu_memory_utilization: float = default("gpu_memory_utilization")
    enforce_eager: bool = default("enforce_eager")
    seed: int = 0
    warmup: bool = True
    # native engine only (docs/design/native-engine.md): torch.compile the per-layer blocks before
    # CUDA-graph capture (GPU), and the decode batch buckets ("" = the engine's default)
    native_compile: bool = default("native_compile")
    native_batch_buckets: str = default("native_batch_buckets")
    native_kernels: str = default("native_kernels")
    native_overlap: bool = default("native_overlap")
    native_loop_thread: bool = default("native_loop_thread")
    native_deep_overlap_rows: int = default("native_deep_overlap_rows")
    native_admit_after_step: bool = default("native_admit_after_step")
    native_admit_after_codec: bool = default("native_admit_after_codec")
    native_admit_hold_ms: int = default("native_admit_hold_ms")
    native_admit_hold_requests: int = default("native_admit_hold_requests")
    native_admit_hold_min_rows: int = default("native_admit_hold_min_rows")
    native_prefill_kernel_rows: int = default("native_prefill_kernel_rows")
    native_pdl: str = default("native_pdl")
    native_split_k: int = default("native_split_k")
    prompt_device: str = default("prompt_device")
    engine_cpu_threads: int = default("engine_cpu_threads")
    # pipeline fused (serving/talker/fused.py): the codec runs in this model, scheduled by
    # playback deadline with these chunk sizes; codec_max_batch is its largest batch
    pipeline: str = default("pipeline")
    fused_buffer_ms: int = default("fused_buffer_ms")
    fused_ride_along: str = default("fused_ride_along")
    fused_first_on_device: bool = default("fused_first_on_device")
    fused_finish: str = default("fused_finish")
    fused_ahead_batch: int = default("fused_ahead_batch")
    first_chunk_frames: int = default("first_chunk_frames")
    chunk_ramp: tuple = int_list(default("chunk_ramp"))
    chunk_frames: int = default("chunk_frames")
    codec_dtype: str = default("codec_dtype")
    codec_cuda_graphs: bool = default("codec_cuda_graphs")
    codec_compile: bool = default("codec_compile")
    codec_channels_last: bool = default("codec_channels_last")
    codec_max_batch: int = default("codec_max_batch_size")
    codec_state_slots: int = 128
    # split pipeline with gpus > 1: the index of the GPU (among those the server sees) this model's
    # engine runs on; -1: the process's default GPU
    gpu: int = -1

    def __post_init__(self):
        _choice("engine", self.engine, choices("engine"))
        _check_gpu(self.gpu, self.device)
        _choice("pipeline", self.pipeline, choices("pipeline"))
        if self.pipeline == "fused" and self.engine != "native":
            raise ModelConfigError("parameter 'pipeline' fused needs engine native (the codec runs in its loop)")
        _choice("codec_dtype", self.codec_dtype, choices("codec_dtype"))
        object.__setattr__(self, "codec_dtype", device_dtype(self.codec_dtype, self.device))
        check_chunk_schedule(self.first_chunk_frames, self.chunk_ramp, self.chunk_frames)
        _allowed("fused_buffer_ms", self.fused_buffer_ms)
        _allowed("fused_ahead_batch", self.fused_ahead_batch)
        if self.codec_max_batch < 1 or self.codec_state_slots < 1:
            raise ModelConfigError("parameters 'codec_max_batch' and 'codec_state_slots' must be >= 1")
        self.batch_buckets()  # validates native_batch_buckets
        _choice("native_kernels", self.native_kernels, choices("native_kernels"))
        _choice("native_pdl", self.native_pdl, choices("native_pdl"))
        _allowed("native_split_k", self.native_split_k)
        _allowed("native_prefill_kernel_rows", self.native_prefill_kernel_rows)
        _allowed("native_deep_overlap_rows", self.native_deep_overlap_rows)
        _allowed("native_admit_hold_ms", self.native_admit_hold_ms)
        _allowed("native_admit_hold_requests", self.native_admit_hold_requests)
        _allowed("native_admit_hold_min_rows", self.native_admit_hold_min_rows)
        _choice("prompt_device", self.prompt_device, choices("prompt_device"))
        _allowed("engine_cpu_threads", self.engine_cpu_threads)
        _choice("fused_ride_along", self.fused_ride_along, choices("fused_ride_along"))
        _choice("fused_finish", self.fused_finish, choices("fused_finish"))
        if self.native_kernels == "triton" and (self.engine != "native" or self.device == "cpu"):
            raise ModelConfigError("parameter 'native_kernels' triton needs engine native on a gpu")
        if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", self.device):  # cuda:i: one engine of several (gpus)
            raise ModelConfigError(f"parameter 'device' must be one of cuda, cuda:<index>, cpu; got {self.device!r}")
        _choice("dtype", self.dtype, choices("talker_dtype")[1:])
        if not self.checkpoint:
            raise ModelConfigError("parameter 'checkpoint' is required (a checkpoint directory)")
        _allowed("max_num_seqs", self.max_num_seqs)
        if not 32 <= self.max_model_len <= 32768:
            raise ModelConfigError(f"parameter 'max_model_len' must be in [32, 32768], got {self.max_model_len}")
        if self.kv_cache_memory_bytes < 0:
            raise ModelConfigError("parameter 'kv_cache_memory_bytes' must be >= 0")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ModelConfigError("parameter 'gpu_memory_utilization' must be in (0, 1]")

    def kernels_wanted(self) -> str:
        """``native_kernels`` where no GPU check is needed: ``torch`` for ``auto`` on the CPU,
        else the setting (``auto`` on a GPU is resolved at load: :func:`serving.talker.engines.
        native_kernels`)."""
        if self.native_kernels == "auto" and (self.engine != "native" or self.device == "cpu"):
            return "torch"
        return self.native_kernels

    def prompt_projection_device(self) -> str:
        """The device ``prompt_device`` resolves to: the native engine's GPU for ``auto`` (vLLM's
        engine lives in processes of its own, so this process keeps no CUDA context for it)."""
        if self.prompt_device == "auto" and self.engine == "native" and self.device != "cpu":
            return self.device
        return "cpu"

    def batch_buckets(self):
        """``native_batch_buckets`` as a tuple of ints (None when empty)."""
        text = self.native_batch_buckets.strip()
        if not text:
            return None
        try:
            vals = tuple(int(x) for x in text.split(","))
        except ValueError:
            vals = ()
        if not vals or any(not 1 <= v <= 1024 for v in vals):
            raise ModelConfigError(
                "parameter 'native_batch_buckets' must be a comma-separated list of batch "
                f"sizes in [1, 1024], e.g. '1,8,32,64'; got {self.native_batch_buckets!r}"
            )
        return vals

    @classmethod
    def from_parameters(cls, params):
        return _from_parameters(cls, params)


@dataclass(frozen=True)
class CodecModelConfig:
    checkpoint: str
    runtime: str = default("codec_runtime")  # torch | onnxruntime
    onnx_path: str = ""
    device: str = "cuda"
    dtype: str = default("codec_dtype")
    cuda_graphs: bool = default("codec_cuda_graphs")
    compile: bool = default("codec_compile")
    channels_last: bool = default("codec_channels_last")
    frame_buckets: tuple = ()
    max_frames: int = default("codec_max_frames")
    # codec_decoder_stateful on CUDA with cuda_graphs: one graph per (batch bucket, T) for these
    # EXACT new-frame counts T (a stateful step must never see padded frames: they would enter the
    # state). Default: the tts chunk schedule's sizes (first 2, ramp 4/8/16, chunk 25) plus 1;
    # any other T (e.g. a stream's last, shorter chunk) runs as several graph steps of these
    # sizes (codec.graphs.split_frames), or eagerly when it cannot be split into them.
    stateful_frame_buckets: tuple = DEFAULT_STATEFUL_FRAME_BUCKETS
    # codec_decoder_stateful: where a stream's decoder state lives between chunks. "request": it
    # travels as state_in_* / state_out_* tensors; "resident": this model keeps it in
    # ``state_slots`` preallocated slots keyed by stream_id (one instance only), and releases a
    # stream on its end request or after ``state_idle_timeout_s`` without one (0: never).
    state: str = "request"
    state_slots: int = 128
    state_idle_timeout_s: float = default("codec_state_idle_timeout_s")

    def __post_init__(self):
        _choice("runtime", self.runtime, choices("codec_runtime"))
        _choice("state", self.state, STATE_RESIDENCY)
        if not 1 <= self.state_slots <= 65536:
            raise ModelConfigError(f"parameter 'state_slots' must be in [1, 65536], got {self.state_slots}")
        if not 0 <= self.state_idle_timeout_s <= 86400:
            raise ModelConfigError(
                "parameter 'state_idle_timeout_s' must be in [0, 86400] seconds (0: never), "
                f"got {self.state_idle_timeout_s}"
            )
        _choice("device", self.device, ("cuda", "cpu"))
        _choice("dtype", self.dtype, choices("codec_dtype"))
        object.__setattr__(self, "dtype", device_dtype(self.dtype, self.device))
        if self.runtime == "onnxruntime" and not self.onnx_path:
            raise ModelConfigError("parameter 'onnx_path' is required with runtime onnxruntime")
        if list(self.frame_buckets) != sorted(set(self.frame_buckets)) or any(b < 1 for b in self.frame_buckets):
            raise ModelConfigError(
                f"parameter 'frame_buckets' must be increasing positive ints, got {self.frame_buckets}"
            )
        if not 1 <= self.max_frames <= 8192:
            raise ModelConfigError("parameter 'max_frames' must be in [1, 8192]")
        check_stateful_frame_buckets(self.stateful_frame_buckets, self.max_frames)

    @classmethod
    def from_parameters(cls, params):
        return _from_parameters(cls, params)


def check_stateful_frame_buckets(buckets, max_frames: int = 8192) -> tuple:
    """Validate ``stateful_frame_buckets``: a non-empty, strictly ascending list of ints in
    [1, max_frames]. Returns it as a tuple; raises :class:`ModelConfigError` naming the field."""
    vals = tuple(buckets) if isinstance(buckets, (tuple, list)) else None
    ok = (
        bool(vals)
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= max_frames for v in vals)
        and all(a < b for a, b in zip(vals, vals[1:]))
    )
    if not ok:
        raise ModelConfigError(
            f"parameter 'stateful_frame_buckets' must be a non-empty, strictly ascending comma-separated list of "
            f"frame counts in [1, {max_frames}] (max_frames), e.g. "
            f"'{','.join(str(v) for v in DEFAULT_STATEFUL_FRAME_BUCKETS)}'; got {buckets!r}"
        )
    return vals


@dataclass(frozen=True)
class TtsModelConfig:
    checkpoint: str
    talker_model: str = "talker"
    codec_model: str = "codec_decoder"
    codec_mode: str = default("codec_mode")  # windowed | stateful (codec_model is then the stateful codec)
    # fused: the talker sends audio (its engine runs the codec); no codec model is called
    pipeline: str = default("pipeline")
    # stateful codec without optional inputs (TensorRT): a stream's first chunk sends an all-zero
    # state instead of start=true
    codec_zero_state_start: bool = False
    # stateful codec: "request" (the state travels with each chunk) or "resident" (the codec keeps
    # it by stream id; the tts sends frames, a stream id and start/end flags)
    codec_state: str = "request"
    default_task_type: str = ""  # empty: the checkpoint's own task type
    default_speaker: str = ""
    default_language: str = "auto"
    default_sample_format: str = "float32"
    default_stream: bool = True
    # sampling of requests that give none: -1 / 0 = the checkpoint's generation_config.json
    default_temperature: float = -1.0
    default_top_k: int = 0
    default_max_frames: int = default("default_max_frames")
    max_frames_limit: int = default("max_frames_limit")
    # The talker's max_model_len must hold max_frames_limit frames after the longest prompt these
    # allow (serving/repository.py talker_context sizes it; the builder fails when it cannot).
    max_text_chars: int = default("max_text_chars")
    max_instruct_chars: int = default("max_instruct_chars")
    ref_min_seconds: float = 1.0
    ref_max_seconds: float = 30.0
    first_chunk_frames: int = default("first_chunk_frames")
    chunk_ramp: tuple = int_list(default("chunk_ramp"))
    chunk_frames: int = default("chunk_frames")
    left_context_frames: int = default("left_context_frames")
    codec_frame_buckets: tuple = ()
    # one pipeline per GPU (serving/tts/router.py): a count or "all" (every visible GPU, counted at
    # load); split: the talker and codec models of GPU i are talker_model_i and codec_model_i
    gpus: str = default("gpus")
    # pipeline fused: each GPU's engine in a worker process (serving/talker/worker.py) or in this one
    fused_workers: str = default("fused_workers")
    max_in_flight: int = default("max_in_flight")
    max_queued: int = default("max_queued")
    # A request that makes no progress (no talker frames, no audio) for this long fails with
    # UNAVAILABLE and frees its talker request, codec state and admission slot.
    request_deadline_s: float = default("request_deadline_s")
    # Base voice cloning: reference voices kept by voice_id (LRU; 0 = no cache) and where the
    # speaker and codec encoders run (Base checkpoints only).
    voice_cache_size: int = default("voice_cache_size")
    encoder_device: str = "cpu"  # cpu | cuda

    def __post_init__(self):
        if not self.checkpoint:
            raise ModelConfigError("parameter 'checkpoint' is required (a checkpoint directory)")
        if not 0 <= self.voice_cache_size <= MAX_VOICE_CACHE_SIZE:
            raise ModelConfigError(
                f"parameter 'voice_cache_size' must be in [0, {MAX_VOICE_CACHE_SIZE}] "
                f"(0 disables the voice cache), got {self.voice_cache_size}"
            )
        _choice("encoder_device", self.encoder_device, ("cpu", "cuda"))
        check_chunk_schedule(self.first_chunk_frames, self.chunk_ramp, self.chunk_frames)
        if self.default_task_type:
            _choice("default_task_type", self.default_task_type, TASK_TYPES)
        _choice("default_sample_format", self.default_sample_format, SAMPLE_FORMATS)
        if not 0.5 <= self.request_deadline_s <= 3600:
            raise ModelConfigError(
                f"parameter 'request_deadline_s' must be in [0.5, 3600] seconds, got {self.request_deadline_s}"
            )
        _choice("codec_mode", self.codec_mode, choices("codec_mode"))
        _choice("pipeline", self.pipeline, choices("pipeline"))
        _choice("fused_workers", self.fused_workers, choices("fused_workers"))
        _choice("codec_state", self.codec_state, STATE_RESIDENCY)
        if self.codec_state == "resident" and self.codec_zero_state_start:
            raise ModelConfigError(
                "parameter 'codec_zero_state_start' needs codec_state request (a resident-state "
                "codec opens streams with start=true)"
            )
        AdmissionConfig(self.max_in_flight, self.max_queued)
        try:
            n = parse_gpus(self.gpus)
        except DeviceError as e:
            raise ModelConfigError(f"parameter {e}") from None
        if n is None and self.pipeline == "split":
            raise ModelConfigError(
                "parameter 'gpus' all is resolved by the repository builder for pipeline split "
                "(it writes one talker and codec model per GPU); give the number"
            )

    @classmethod
    def from_parameters(cls, params):
        return _from_parameters(cls, params)

    def limits(self, checkpoint_task_type: str, generation: Optional[GenerationDefaults] = None) -> TtsLimits:
        """The request limits and defaults; sampling defaults not set here come from ``generation``
        (the checkpoint's ``generation_config.json``; None: the official wrapper's defaults)."""
        generation = generation or GenerationDefaults()
        gs = Sampling.from_generation(generation)
        return TtsLimits(
            default_task_type=self.default_task_type or checkpoint_task_type,
            default_speaker=self.default_speaker.lower() or None,
            default_language=self.default_language.lower(),
            default_sample_format=self.default_sample_format,
            default_stream=self.default_stream,
            default_temperature=gs.temperature if self.default_temperature < 0 else self.default_temperature,
            default_top_k=gs.top_k if self.default_top_k == 0 else self.default_top_k,
            default_top_p=gs.top_p,
            default_repetition_penalty=gs.repetition_penalty,
            default_subtalker_temperature=gs.subtalker_temperature,
            default_subtalker_top_k=gs.subtalker_top_k,
            default_subtalker_top_p=gs.subtalker_top_p,
            default_max_frames=self.default_max_frames,
            max_frames_limit=self.max_frames_limit,
            max_text_chars=self.max_text_chars,
            max_instruct_chars=self.max_instruct_chars,
            ref_min_seconds=self.ref_min_seconds,
            ref_max_seconds=self.ref_max_seconds,
        )

    def admission(self) -> AdmissionConfig:
        return AdmissionConfig(self.max_in_flight, self.max_queued)

    def worker_processes(self, lanes: int, device: str = "cuda") -> bool:
        """Pipeline fused over ``lanes`` lanes on ``device`` (``cuda...`` or ``cpu``): True when each
        engine runs in a worker process. ``auto``: on CUDA always (one GPU served twice the open-loop
        rate so, docs/benchmark-history.md run 26), on the CPU only for several lanes (one CPU lane
        in the tts process keeps the CPU tests and small machines to one model load)."""
        if self.fused_workers != "auto":
            return self.fused_workers == "process"
        return lanes > 1 or device.startswith("cuda")
