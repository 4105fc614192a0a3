"""Every setting of a model repository, written once: name, default, allowed values and help.

:data:`SETTINGS` is the one list. From it come:

* the repository builder's settings (``serving/repository.py`` ``RepositorySettings``, generated
  from this list) and its command-line flags (``qwen3-tts-build-repository --help``: underscores
  become dashes, the allowed values and the help are these);
* the ``config.pbtxt`` parameters (``model_repository/*/config.pbtxt.in`` fill ``${name}`` from the
  settings) and the defaults of the typed configs the models parse them into at load time
  (``serving/model_config.py`` takes its defaults and allowed values from here);
* the settings table in README.md (``python scripts/render_settings.py`` writes it between
  ``<!-- settings:begin -->`` and ``<!-- settings:end -->``; ``tests/test_settings.py`` fails when
  README and this list disagree).

The type of a setting is the type of its default (``bool``, ``int``, ``float`` or ``str``).
``choices`` lists the allowed values of an enumerated setting, ``lo``/``hi`` bound a number,
``pattern`` (a regular expression the whole value must match, described by ``pattern_text``)
constrains a text one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from triton_qwen3_tts.engines.native.options import KERNELS, PDL_MODES
from triton_qwen3_tts.serving.talker.deadline import FINISH, RIDE_ALONG

__all__ = [
    "Setting",
    "SettingError",
    "SETTINGS",
    "BY_NAME",
    "default",
    "choices",
    "check",
    "render_table",
    "device_dtype",
]


class SettingError(ValueError):
    """A setting's value is not allowed; the message starts with the setting's name."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    choices: Tuple[Any, ...] = ()
    lo: Optional[float] = None
    hi: Optional[float] = None
    group: str = ""
    pattern: str = ""
    pattern_text: str = ""

    @property
    def type(self) -> type:
        return type(self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def allowed(self) -> str:
        """The allowed values in words (for help texts, errors and README)."""
        if self.choices:
            return ", ".join(repr(c) if c == "" else str(c) for c in self.choices)
        if self.pattern:
            return self.pattern_text
        if self.type is bool:
            return "true, false"
        if self.lo is not None and self.hi is not None:
            return f"{self.lo:g} to {self.hi:g}"
        if self.lo is not None:
            return f">= {self.lo:g}"
        return "any"

    def check(self, value: Any) -> Any:
        """``value`` if allowed, else :class:`SettingError` naming the setting and what is allowed."""
        t = self.type
        ok = isinstance(value, t) and not (t is not bool and isinstance(value, bool))
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise SettingError(f"{self.name}: expected a {t.__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise SettingError(f"{self.name}: must be one of {self.allowed()}; got {value!r}")
        if self.pattern and not re.fullmatch(self.pattern, value):
            raise SettingError(f"{self.name}: must be {self.allowed()}; got {value!r}")
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise SettingError(f"{self.name}: must be {self.allowed()}; got {value!r}")
        return value


_DTYPES = ("bfloat16", "float16", "float32")

SETTINGS: Tuple[Setting, ...] = (
    # ---- where and how
    Setting(
        "checkpoint", "", "checkpoint directory in the official Hugging Face layout (required)", group="repository"
    ),
    Setting(
        "device",
        "auto",
        "where the talker and codec run; auto: gpu when a CUDA GPU is visible, else cpu",
        choices=("auto", "gpu", "cpu"),
        group="repository",
    ),
    Setting(
        "pipeline",
        "split",
        "fused (experimental; the fastest on the H100, docs/benchmark-history.md run 23): "
        "one model: the tts hosts the native talker engine, which also decodes the audio (stateful codec "
        "in the same process, one scheduler ordering talker steps and codec batches by playback deadline; "
        "engine native, tts_instances 1); split: the talker model streams frames to a codec model",
        choices=("split", "fused"),
        group="repository",
    ),
    Setting(
        "gpus",
        "1",
        "GPUs to serve on, one self-contained pipeline each (talker engine and codec; a stream stays on "
        "one); new streams go to the least-loaded GPU; max_in_flight is per GPU; all: every GPU the server "
        "sees, counted at load (pipeline split: at build). On cpu, N pipelines share the host",
        pattern=r"all|[1-9][0-9]*",
        pattern_text="a number of GPUs >= 1, or all",
        group="repository",
    ),
    Setting(
        "fused_workers",
        "auto",
        "pipeline fused: where each GPU's talker engine (with its codec) runs. process: a process of its "
        "own per GPU, started by the tts, so each engine's scheduler has a Python interpreter to itself; "
        "thread: inside the tts process (one GPU: on the tts's event loop; several: a thread each); "
        "auto: process on GPUs, and on the CPU with gpus > 1 (thread for one CPU lane)",
        choices=("auto", "process", "thread"),
        group="repository",
    ),
    Setting(
        "engine",
        "vllm",
        "talker engine: vLLM with this package's plugin, or the native CUDA-graph engine",
        choices=("vllm", "native"),
        group="talker",
    ),
    Setting(
        "codec_backend",
        "auto",
        "windowed codec_decoder: a TensorRT plan or the Python backend (torch / onnxruntime); "
        "auto: tensorrt on a gpu with a plan, else python",
        choices=("auto", "tensorrt", "python"),
        group="codec",
    ),
    Setting("plan", "", "TensorRT plan of the codec decoder to copy in (codec_backend tensorrt)", group="codec"),
    # ---- talker
    Setting(
        "talker_dtype",
        "",
        "talker weights and activations; '' = bfloat16 on gpu, float32 on cpu",
        choices=("",) + _DTYPES,
        group="talker",
    ),
    Setting("max_num_seqs", 64, "talker requests decoded together at most", lo=1, hi=1024, group="talker"),
    Setting(
        "max_model_len",
        0,
        "talker context (prompt + frames) per request; 0: sized from max_frames_limit, max_text_chars and "
        "max_instruct_chars so that every request they allow fits (a smaller explicit value fails the build)",
        lo=0,
        group="talker",
    ),
    Setting(
        "kv_cache_memory_bytes",
        0,
        "vLLM's KV cache pool; 0: gpu_memory_utilization on gpu, sized to the model and context on cpu "
        "(max_num_seqs x max_model_len positions, 32 MiB floor, at most 1/4 of the memory)",
        lo=0,
        group="talker",
    ),
    Setting(
        "gpu_memory_utilization",
        0.5,
        "vLLM on gpu: share of GPU memory for weights and KV cache",
        lo=0.01,
        hi=1.0,
        group="talker",
    ),
    Setting("enforce_eager", False, "vLLM: no CUDA graphs (slower; for debugging)", group="talker"),
    Setting(
        "native_compile",
        False,
        "native engine on gpu: torch.compile the layer blocks before CUDA-graph capture",
        group="talker",
    ),
    Setting(
        "native_kernels",
        "auto",
        "native engine: the decode step's layers (talker and code predictor) as torch blocks, or as "
        "fused Triton kernels (gpu only); 'auto' = the kernels on a GPU that runs them (compute "
        "capability 8.0 or newer, Triton installed, their self-test passing), the torch blocks otherwise",
        choices=("auto", *KERNELS),
        group="talker",
    ),
    Setting(
        "native_overlap",
        True,
        "native engine: launch each decode step before reading the previous step's frames, so the "
        "loop's host work (frames to the streams, releases, admissions) overlaps the GPU; a row whose "
        "EOS is read then has run one extra step, its frame dropped (false: read each step first)",
        group="talker",
    ),
    Setting(
        "native_deep_overlap_rows",
        0,
        "native engine with native_overlap: from this many active rows the loop keeps two decode "
        "steps launched and unread on the GPU instead of one, so that an iteration whose host work "
        "outlasts a step (an admission, a codec call's launch) does not leave the GPU idle; a frame "
        "then reaches its stream one step later, and while two steps are unread a first chunk does "
        "not take its last frame on the device (fused_first_on_device). 0: always one",
        lo=0,
        hi=65536,
        group="talker",
    ),
    Setting(
        "native_admit_after_step",
        False,
        "native engine with native_overlap: while requests decode, launch their decode step before "
        "admitting new ones (slot rows, padded prompts, prefill), so the admission's host work runs "
        "while the GPU has that step queued; the new requests join the next step, their first "
        "frame one step later (false: admit first)",
        group="talker",
    ),
    Setting(
        "native_admit_after_codec",
        False,
        "native engine with pipeline fused: while requests decode, launch the codec call (when the "
        "scheduler makes one) before admitting new ones, so the GPU has it queued while the loop builds "
        "the admission; the new requests still join the same step, their prefill behind that call "
        "(false: admit first)",
        group="talker",
    ),
    Setting(
        "native_admit_hold_ms",
        0,
        "native engine: while requests decode, hold new requests up to about this many milliseconds so that "
        "they are admitted together (one prefill and one first-chunk codec call for several), or until "
        "native_admit_hold_requests wait; more audio per GPU-second under load at up to this much more "
        "time to first audio; an idle engine admits at once (0: admit every loop iteration)",
        lo=0,
        hi=1000,
        group="talker",
    ),
    Setting(
        "native_admit_hold_requests",
        8,
        "native engine with native_admit_hold_ms: admit the held requests as soon as this many wait "
        "(or as many as there are free slots)",
        lo=1,
        hi=65536,
        group="talker",
    ),
    Setting(
        "native_admit_hold_min_rows",
        1,
        "native engine with native_admit_hold_ms: hold new requests only while at least this many rows "
        "decode, so that a lightly loaded engine admits at once and only a busy one groups admissions",
        lo=1,
        hi=65536,
        group="talker",
    ),
    Setting(
        "native_loop_thread",
        True,
        "native engine: run the scheduler loop on a thread of its own, handing each iteration's "
        "frames to the event loop without waiting for it, so the event loop's work (streams, "
        "requests) runs while the loop waits for the GPU (false: each iteration in the event "
        "loop's executor, the hand-over between iterations)",
        group="talker",
    ),
    Setting(
        "native_prefill_kernel_rows",
        64,
        "native engine with the Triton kernels: a prefill of at most this many padded rows (prompts x "
        "length bucket) runs the talker layers' GEMMs on the kernels (norms folded in, residual and "
        "SwiGLU epilogues); larger ones, and all with 0, on the torch blocks (64: the largest size "
        "that measured faster on the kernels, run 40b)",
        lo=0,
        hi=65536,
        group="talker",
    ),
    Setting(
        "native_pdl",
        "few",
        "native engine with the Triton kernels on Hopper or newer: programmatic dependent launch (a "
        "kernel starts while the previous one ends and waits for it before reading its output); "
        "'few' = for launches of at most two rows (one-stream steps: the one-row step 3.6 -> 3.0-3.1 "
        "ms on the H200), 'on' = every launch (the 64-row step slower), 'prefetch' = 'on' with the "
        "GEMMs' weights prefetched into L2, 'off' = none",
        choices=PDL_MODES,
        group="talker",
    ),
    Setting(
        "native_split_k",
        1,
        "native engine with the Triton kernels: a tiled GEMM launch of few output tiles cuts K "
        "into parts run by programs of their own (split-K; the tile's last program adds the "
        "parts) while the launch stays within this many programs per multiprocessor, so that decode "
        "GEMMs of few output tiles (the code predictor's at 4-64 rows, the talker's largest with "
        "wide tiles) keep more weight loads in flight; 0 = never (and no wide tiles)",
        lo=0,
        hi=16,
        group="talker",
    ),
    Setting(
        "prompt_device",
        "auto",
        "where each prompt's text rows are projected (two text-width GEMMs per row, float32): 'auto' = "
        "the native engine's GPU (the CPU for vllm or on cpu), 'cpu' = on the CPU",
        choices=("auto", "cpu"),
        group="talker",
    ),
    Setting(
        "engine_cpu_threads",
        0,
        "torch's CPU threads in each process that runs a talker engine on a GPU (a fused worker, the tts "
        "with fused_workers thread, a split pipeline's talker): its host tensor work, a prompt_device cpu "
        "projection; 0 = the host's CPUs over the GPUs the process sees, at most 4 (torch's default, a "
        "thread per core in every such process, keeps idle cores spinning and slows the engines' loops)",
        lo=0,
        hi=256,
        group="talker",
    ),
    Setting(
        "native_batch_buckets",
        "",
        "native engine: decode batch sizes with a captured graph, e.g. 1,8,32,64 ('' = the engine's default); "
        "prefills have their own buckets (every power of two prompts up to max_num_seqs)",
        group="talker",
    ),
    Setting(
        "fused_buffer_ms",
        400,
        "pipeline fused: decode a stream's next audio once its client's buffer holds less than this; "
        "with more, its frames wait and go out later in one larger chunk",
        lo=20,
        hi=60000,
        group="talker",
    ),
    Setting(
        "fused_ride_along",
        "due",
        "pipeline fused: which streams fill a codec call beside the most urgent ones: 'schedule' = "
        "those with their next scheduled chunk ready; 'due' = also those whose buffer is below "
        "fused_buffer_ms, with a chunk of at least half their scheduled one (fewer, fuller calls; more, "
        "smaller chunks)",
        choices=RIDE_ALONG,
        group="talker",
    ),
    Setting(
        "fused_finish",
        "split",
        "pipeline fused: a stream whose talker is done (its request ends after its last audio): 'split' = "
        "its rest rounded down to the codec's frame counts, several calls if need be, ranked with the "
        "due streams by buffer; 'pad' = its rest in one call, padded to the next frame count and the "
        "padding's audio dropped (the same audio); 'pad_first' = that, ranked before the due streams "
        "(after first chunks and critical ones)",
        choices=FINISH,
        group="talker",
    ),
    Setting(
        "fused_ahead_batch",
        0,
        "pipeline fused: while the talker runs, streams whose client buffer is full (fused_buffer_ms) and "
        "that have a whole chunk_frames chunk pending are decoded together once at least this many do, "
        "in the codec's fullest calls, instead of waiting (a stream far ahead of playback otherwise keeps "
        "most of its frames until its talker is done, and its request ends after their decodes). 0: off",
        lo=0,
        hi=1024,
        group="talker",
    ),
    Setting(
        "fused_first_on_device",
        True,
        "pipeline fused: a stream's first chunk takes its last frame from the talker step still on the "
        "GPU, gathered on the device behind it, so the codec call is launched without waiting for that "
        "step (false: the loop waits for the step and reads it first, and the GPU idles while the loop "
        "prepares the call)",
        group="talker",
    ),
    # ---- codec
    Setting(
        "codec_mode",
        "windowed",
        "windowed: codec_decoder re-decodes a left context with each chunk; stateful: "
        "codec_decoder_stateful decodes only the new frames, exactly",
        choices=("windowed", "stateful"),
        group="codec",
    ),
    Setting(
        "codec_runtime",
        "torch",
        "Python-backend codec: torch or onnxruntime",
        choices=("torch", "onnxruntime"),
        group="codec",
    ),
    Setting("codec_onnx_path", "", "codec_runtime onnxruntime: the ONNX file of the codec", group="codec"),
    Setting(
        "codec_dtype",
        "",
        "Python-backend codec precision (the fused pipeline's codec too); '' = bfloat16 on gpu, float32 on cpu",
        choices=("",) + _DTYPES,
        group="codec",
    ),
    Setting(
        "codec_cuda_graphs", True, "Python-backend codec on gpu: CUDA graphs per batch and frame bucket", group="codec"
    ),
    Setting(
        "codec_compile",
        False,
        "stateful codec on gpu with CUDA graphs (codec_mode stateful, pipeline fused): torch.compile the "
        "decoder step (dynamic batch and frames) before capture",
        group="codec",
    ),
    Setting(
        "codec_channels_last",
        True,
        "stateful codec on gpu: the vocoder's activations channels-last (convolutions as cuDNN's NHWC kernels "
        "without a layout transpose around each, coalesced elementwise kernels between them); false: the "
        "reference [batch, channels, samples] layout",
        group="codec",
    ),
    Setting("codec_max_batch_size", 64, "codec requests Triton batches together at most", lo=1, hi=1024, group="codec"),
    Setting(
        "codec_queue_delay_us", 1000, "codec dynamic batcher: longest wait for a fuller batch", lo=0, group="codec"
    ),
    Setting("codec_instances", 1, "codec model instances", lo=1, hi=64, group="codec"),
    Setting(
        "codec_frame_buckets",
        "",
        "windowed codec: frame counts it pads to (one CUDA graph / TensorRT profile each); '' = from the chunk "
        "schedule",
        group="codec",
    ),
    Setting("codec_max_frames", 512, "frames one codec request may carry", lo=1, hi=8192, group="codec"),
    Setting(
        "codec_stateful_frame_buckets",
        "",
        "stateful codec on gpu: new-frame counts with a CUDA graph ('' = the chunk schedule's sizes plus 1)",
        group="codec",
    ),
    Setting(
        "codec_stateful_backend",
        "python",
        "codec_mode stateful: codec_decoder_stateful on the Python backend or a TensorRT plan",
        choices=("python", "tensorrt"),
        group="codec",
    ),
    Setting(
        "stateful_plan", "", "TensorRT plan of the stateful codec (codec_stateful_backend tensorrt)", group="codec"
    ),
    Setting(
        "codec_state",
        "",
        "codec_mode stateful: where a stream's decoder state lives between chunks; resident: inside the codec "
        "model by stream id; request: sent with every chunk; '' = resident on python, request on tensorrt",
        choices=("", "resident", "request"),
        group="codec",
    ),
    Setting(
        "codec_state_slots",
        0,
        "state resident: streams held at once (per GPU); 0 = 2 x max_in_flight x tts_instances",
        lo=0,
        hi=65536,
        group="codec",
    ),
    Setting(
        "codec_state_idle_timeout_s",
        300.0,
        "state resident: release a stream idle this long (its caller vanished); 0: never",
        lo=0,
        hi=86400,
        group="codec",
    ),
    # ---- tts: requests
    Setting("default_speaker", "", "speaker of requests that name none ('' = the checkpoint's first)", group="tts"),
    Setting(
        "default_max_frames",
        2048,
        "max_frames of requests that give none (12.5 frames per second of audio)",
        lo=1,
        hi=32768,
        group="tts",
    ),
    Setting("max_frames_limit", 4096, "largest max_frames a request may ask for", lo=1, hi=32768, group="tts"),
    Setting("max_text_chars", 2000, "longest text and ref_text, in characters", lo=1, hi=100000, group="tts"),
    Setting("max_instruct_chars", 1000, "longest instruct, in characters", lo=1, hi=100000, group="tts"),
    Setting(
        "first_chunk_frames",
        2,
        "frames of a stream's first audio chunk (time to first audio)",
        lo=1,
        hi=8192,
        group="tts",
    ),
    Setting(
        "chunk_ramp", "4,8,16", "frames of the chunks after the first, before chunk_frames (each 1 to it)", group="tts"
    ),
    Setting("chunk_frames", 25, "frames of every later chunk", lo=1, hi=8192, group="tts"),
    Setting(
        "left_context_frames",
        72,
        "windowed codec: frames of left context decoded with each chunk",
        lo=0,
        hi=8192,
        group="tts",
    ),
    Setting(
        "max_in_flight",
        64,
        "requests a tts instance serves at once on each GPU (gpus: gpus x this in all)",
        lo=1,
        hi=100000,
        group="tts",
    ),
    Setting(
        "max_queued", 64, "requests a tts instance queues beyond those (then UNAVAILABLE)", lo=0, hi=100000, group="tts"
    ),
    Setting(
        "request_deadline_s",
        60.0,
        "a request without progress this long fails with UNAVAILABLE",
        lo=0.5,
        hi=3600,
        group="tts",
    ),
    Setting(
        "tts_instances",
        1,
        "tts stub processes (admission limits and voice cache are per instance)",
        lo=1,
        hi=64,
        group="tts",
    ),
    Setting(
        "voice_cache_size",
        256,
        "Base checkpoints: reference voices kept by voice_id (0: none)",
        lo=0,
        hi=65536,
        group="tts",
    ),
)

BY_NAME = {s.name: s for s in SETTINGS}


def default(name: str) -> Any:
    """The default of setting ``name``."""
    return BY_NAME[name].default


def choices(name: str, *, resolved: bool = False) -> Tuple[Any, ...]:
    """The allowed values of setting ``name``; ``resolved``: without ``auto`` (what a model gets)."""
    return tuple(c for c in BY_NAME[name].choices if not (resolved and c == "auto"))


def device_dtype(value: str, device: str) -> str:
    """A precision setting's value (``talker_dtype``, ``codec_dtype``) for ``device``: '' means
    bfloat16 on a GPU and float32 on the CPU (where bf16 matmuls are slow and tests need fp32)."""
    return value or ("float32" if device == "cpu" else "bfloat16")


def check(name: str, value: Any) -> Any:
    return BY_NAME[name].check(value)


def int_list(text: str) -> Tuple[int, ...]:
    """A comma-separated list setting's integers ("2, 4,8" -> (2, 4, 8); spaces and empty items
    ignored, "" -> ()): the one reading of ``chunk_ramp``-style values, for the repository
    builder and the models' parameters alike. ValueError where an item is not an int."""
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def render_table() -> str:
    """The Markdown table of every setting (README.md, between the settings markers)."""
    rows = ["| flag | default | allowed | what |", "|---|---|---|---|"]
    for s in SETTINGS:
        d = s.default
        shown = (
            "—"
            if s.name == "checkpoint"
            else "`''`"
            if d == ""
            else f"`{str(d).lower() if isinstance(d, bool) else d}`"
        )
        rows.append(f"| `{s.flag}` | {shown} | {s.allowed()} | {s.help} |")
    return "\n".join(rows) + "\n"
