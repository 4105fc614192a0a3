"""Write a ready Triton model repository from the templates in ``model_repository/``.

``qwen3-tts-build-repository`` (:mod:`triton_qwen3_tts.tools.build_repository`; also
``scripts/build_model_repository.py``) is the command-line front end. The templates hold
``${name}`` placeholders; every placeholder must be filled (an unfilled one fails the build with
its name), and the result is validated by parsing it back (``parameters`` round-trip through the
same typed configs the models use at load time).
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import string
import subprocess
from dataclasses import asdict, dataclass, field, fields, make_dataclass
from typing import Dict, Tuple

from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.settings import SETTINGS, SettingError, check, device_dtype, int_list


def find_templates() -> str:
    """The folder of the model templates: the package's ``templates`` folder in an installed wheel
    (pyproject.toml maps ``model_repository/`` there), else ``model_repository/`` of the checkout
    this package runs from (editable install, or a source tree on ``sys.path``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in (os.path.join(package, "templates"), os.path.join(os.path.dirname(package), "model_repository")):
        if os.path.isfile(os.path.join(d, "tts", "config.pbtxt.in")):
            return d
    return os.path.join(os.path.dirname(package), "model_repository")  # build_repository names it when missing


TEMPLATES = find_templates()


class RepositoryError(ValueError):
    pass


def _cross_checks(self) -> None:
    """The checks that involve several settings or the file system (each setting's own type, allowed
    values and range are checked against serving/settings.py)."""
    if "auto" in (self.device, self.codec_backend):
        raise RepositoryError("device and codec_backend 'auto' are resolved first (resolve_auto)")
    if self.pipeline == "fused" and self.engine != "native":
        raise RepositoryError("pipeline fused needs engine native (the codec runs in the native engine's loop)")
    if self.gpus == "all" and self.device == "cpu":
        raise RepositoryError(
            "gpus all counts CUDA GPUs, and device is cpu: give a number (on cpu, N pipelines share the host)"
        )
    if self.pipeline == "fused" and self.tts_instances != 1:
        raise RepositoryError("pipeline fused needs tts_instances 1 (the tts hosts the one talker engine)")
    if self.codec_backend == "tensorrt" and self.device == "cpu":
        raise RepositoryError("codec_backend tensorrt needs device gpu (use --codec-backend python on CPU)")
    if self.codec_backend == "tensorrt" and self.plan and not os.path.exists(self.plan):
        raise RepositoryError(f"TensorRT plan {self.plan} does not exist (build it with export/build_trt_engine.py)")
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
    if not 1 <= self.default_max_frames <= self.max_frames_limit:
        raise RepositoryError(
            f"default_max_frames must be in [1, max_frames_limit={self.max_frames_limit}], "
            f"got {self.default_max_frames}"
        )
    from triton_qwen3_tts.serving.model_config import chunk_schedule_problem

    try:
        ramp = int_list(self.chunk_ramp)
    except ValueError:
        raise RepositoryError(f"chunk_ramp: comma-separated frame counts, got {self.chunk_ramp!r}") from None
    if not ramp:
        # the models read an empty parameter as the setting's default ramp, not as none
        raise RepositoryError(
            "chunk_ramp: at least one frame count (for no ramp, give chunk_frames itself, e.g. --chunk-ramp 16)"
        )
    problem = chunk_schedule_problem(self.first_chunk_frames, ramp, self.chunk_frames)
    if problem is not None:
        raise RepositoryError(problem[1])
    if not os.path.isfile(os.path.join(self.checkpoint, "config.json")):
        raise RepositoryError(f"{self.checkpoint} is not a checkpoint directory (no config.json)")


def _validate(self) -> None:
    for f in fields(self):
        try:
            check(f.name, getattr(self, f.name))
        except SettingError as e:
            raise RepositoryError(str(e)) from None
    if not self.checkpoint:
        raise RepositoryError("checkpoint: required (a checkpoint directory in the official layout)")
    _cross_checks(self)


# Every setting of serving/settings.py, with its default: what the builder's flags set and the
# templates' ${name} placeholders read.
RepositorySettings = make_dataclass(
    "RepositorySettings",
    [("checkpoint", str)] + [(x.name, x.type, field(default=x.default)) for x in SETTINGS if x.name != "checkpoint"],
    namespace={"validate": _validate, "__doc__": "The settings of one model repository (serving/settings.py)."},
)
RepositorySettings.__module__ = __name__


def detect_device(env=None) -> Tuple[str, str]:
    """``("gpu" | "cpu", why)`` from what this machine shows, without importing torch: an NVIDIA GPU
    in ``/proc/driver/nvidia/gpus`` or listed by ``nvidia-smi -L``, unless ``CUDA_VISIBLE_DEVICES``
    hides them all."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "NoDevFiles"):
        return "cpu", f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    gpus = glob.glob("/proc/driver/nvidia/gpus/*")
    if gpus:
        return "gpu", f"{len(gpus)} NVIDIA GPU(s) in /proc/driver/nvidia/gpus"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        if n:
            return "gpu", f"nvidia-smi lists {n} GPU(s)"
    return "cpu", "no CUDA GPU visible: no NVIDIA driver, nvidia-smi lists none"


def count_gpus(env=None) -> int:
    """NVIDIA GPUs this machine shows (as :func:`detect_device` finds them), at most as many as
    ``CUDA_VISIBLE_DEVICES`` lists when it is set."""
    env = os.environ if env is None else env
    n = len(glob.glob("/proc/driver/nvidia/gpus/*"))
    smi = shutil.which("nvidia-smi")
    if not n and smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([x for x in visible.split(",") if x.strip() and x.strip() != "-1"]))
    return n


def lane_count(s, gpus_found=None) -> int:
    """The number of per-GPU pipelines the builder writes models for: ``gpus`` as a number, or
    for ``all`` with pipeline split the GPUs of this machine (:func:`count_gpus`; the split
    pipeline needs one talker and codec model per GPU, named at build time). Pipeline fused
    writes one tts model whatever the count (``all`` is counted when it loads): 1."""
    if s.pipeline == "fused":
        return 1
    if s.gpus != "all":
        return int(s.gpus)
    n = count_gpus() if gpus_found is None else gpus_found
    if n < 1:
        raise RepositoryError(
            "gpus all with pipeline split: no NVIDIA GPU visible here to count; give the number (--gpus N)"
        )
    return n


def _lane_config(text: str, name: str, gpu) -> str:
    """A per-GPU copy of a talker or codec model's config: named ``name`` and, on a GPU, placed
    on GPU ``gpu``. A codec through its instance group (``kind: KIND_GPU ... gpus: [ gpu ]``; a
    Python codec makes that GPU its current device, serving/stub.py use_instance_gpu; the resident
    stateful codec keeps its one instance); the talker (KIND_MODEL) through its ``gpu`` parameter
    (it shows its process only that GPU, serving/stub.py pin_gpu, which places vLLM too)."""
    text, n = re.subn(r'^name: "[^"]*"', f'name: "{name}"', text, count=1, flags=re.M)
    if n != 1:
        raise RepositoryError(f"{name}: its template has no name line")
    if gpu is None:  # cpu: N pipelines share the host
        return text
    if name.startswith("talker"):
        return text + f'parameters: {{ key: "gpu" value: {{ string_value: "{gpu}" }} }}\n'
    if 'platform: "tensorrt_plan"' in text:
        return re.sub(r"kind: KIND_GPU count: (\S+) \}", rf"kind: KIND_GPU count: \1 gpus: [ {gpu} ] }}", text)
    text, n = re.subn(r"kind: KIND_(GPU|MODEL) count: 1 \}", f"kind: KIND_GPU count: 1 gpus: [ {gpu} ] }}", text)
    if n != 1:
        raise RepositoryError(f"{name}: its template's instance group is not one instance on a GPU")
    return text


def pick_codec_backend(device: str, plan: str, templates: str = TEMPLATES) -> Tuple[str, str]:
    if device != "gpu":
        return "python", "the TensorRT codec needs a gpu"
    if plan:
        return "tensorrt", f"--plan {plan}"
    found = os.path.join(templates, "codec_decoder", "1", "model.plan")
    if os.path.exists(found):
        return "tensorrt", f"plan {found}"
    return "python", "no TensorRT plan (build one with export/build_trt_engine.py and pass --plan)"


def resolve_auto(s) -> list:
    """Resolve ``device`` and ``codec_backend`` ``auto`` in place from what this machine has; returns
    one line per choice made (the builder prints them)."""
    notes = []
    if s.device == "auto":
        s.device, why = detect_device()
        notes.append(f"device: {s.device} ({why}; --device gpu|cpu overrides)")
    if s.codec_backend == "auto":
        s.codec_backend, why = pick_codec_backend(s.device, s.plan)
        notes.append(f"codec backend: {s.codec_backend} ({why}; --codec-backend tensorrt|python overrides)")
    return notes


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
    positions (engines/native/engine.py). vLLM's pool is sized on its own (kv_cache_memory_bytes /
    gpu_memory_utilization) and need only hold one request of ``max_model_len`` positions."""
    t = cfg.talker
    dtype = device_dtype(s.talker_dtype, s.device)
    size = 4 if dtype == "float32" else 2
    return (s.max_num_seqs + 1) * max_model_len * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * size


# vLLM on CPU (kv_cache_memory_bytes 0): the pool is sized to the model and context, not left to vLLM
# (which takes a fixed share of the host's memory, GiBs even for the tiny test model)
CPU_KV_CACHE_FLOOR = 32 * 2**20
CPU_KV_CACHE_MEMORY_SHARE = 0.25
_VLLM_BLOCK = 128  # positions are allocated in blocks; round each request up to a whole one


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def vllm_cpu_kv_cache_bytes(
    s: RepositorySettings, cfg: Qwen3TTSConfig, max_model_len: int, memory: int = -1, engines: int = 1
):
    """The CPU default of vLLM's KV cache pool: ``max_num_seqs`` requests of ``max_model_len``
    positions (rounded up to whole blocks) of this checkpoint's talker, at least
    ``CPU_KV_CACHE_FLOOR``; at most ``CPU_KV_CACHE_MEMORY_SHARE`` of this machine's memory
    (shared by ``engines`` talkers: ``gpus`` N on cpu), but never less than one full-length
    request (what vLLM needs to start). Returns ``(bytes, why)`` for one talker."""
    t = cfg.talker
    dtype = s.talker_dtype or "float32"
    per_pos = t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * (4 if dtype == "float32" else 2)
    one = -(-max_model_len // _VLLM_BLOCK) * _VLLM_BLOCK * per_pos
    need = s.max_num_seqs * one
    why = f"{s.max_num_seqs} seqs x {max_model_len} positions x {per_pos} bytes"
    memory = _physical_memory() if memory < 0 else memory
    cap = int(memory * CPU_KV_CACHE_MEMORY_SHARE) // engines
    if memory and need > cap:
        size = max(one, cap)
        shared = f", shared by {engines} talkers" if engines > 1 else ""
        why += (
            f" would be {need / 2**30:.1f} GiB: capped at {size / 2**30:.1f} GiB "
            f"({max(1, size // one)} full-length requests at once; {CPU_KV_CACHE_MEMORY_SHARE:.0%} of this "
            f"machine's {memory / 2**30:.0f} GiB{shared})"
        )
        return size, why
    if need < CPU_KV_CACHE_FLOOR:
        why += f" raised to the {CPU_KV_CACHE_FLOOR // 2**20} MiB floor"
    return max(need, CPU_KV_CACHE_FLOOR), why


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
            vals = int_list(text)
        else:
            vals = tuple(sorted({1, s.first_chunk_frames, s.chunk_frames, *int_list(s.chunk_ramp)}))
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
    """Write the repository to ``out_dir`` (replaced if it exists); return its path. ``device`` and
    ``codec_backend`` ``auto`` are resolved first (:func:`resolve_auto`)."""
    resolve_auto(s)
    s.validate()
    if not os.path.isfile(os.path.join(templates, "tts", "config.pbtxt.in")):
        raise RepositoryError(
            f"no model templates in {templates} (they ship in the package's templates folder, "
            "or come from model_repository/ of a checkout): reinstall the package"
        )
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
    lanes = lane_count(s)
    values = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in asdict(s).items()}
    kv_bytes, kv_why = s.kv_cache_memory_bytes, "set by --kv-cache-memory-bytes"
    if not kv_bytes and cpu and s.engine == "vllm":
        kv_bytes, kv_why = vllm_cpu_kv_cache_bytes(s, cfg, ctx.max_model_len, engines=lanes)
    values.update(
        checkpoint=ckpt,
        max_model_len=str(ctx.max_model_len),
        kv_cache_memory_bytes=str(kv_bytes),
        device="cpu" if cpu else "cuda",
        talker_dtype=device_dtype(s.talker_dtype, s.device),
        codec_dtype=device_dtype(s.codec_dtype, s.device),
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
        gpus=s.gpus if s.pipeline == "fused" else str(lanes),  # split: "all" counted here
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
            ins, outs = config_io_blocks(specs, device_dtype(s.codec_dtype, s.device))
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
    values["tts_engine_parameters"] = ""
    if s.pipeline == "fused":  # one model: the tts hosts the talker engine, which decodes the audio
        from triton_qwen3_tts.serving.model_config import ENGINE_PREFIX

        models = {"tts": "tts"}
        stateful = False
        with open(os.path.join(templates, "talker", "config.pbtxt.in"), encoding="utf-8") as f:
            talker = _substitute(f.read(), values, "talker/config.pbtxt.in")
        values["tts_engine_parameters"] = "\n".join(
            line.replace('key: "', f'key: "{ENGINE_PREFIX}', 1)
            for line in talker.splitlines()
            if line.startswith("parameters:")
        )
    elif stateful:
        # the tts then talks to codec_decoder_stateful only: loading the windowed codec as well
        # would hold its CUDA graphs (tens of GB at batch 64 x 97 frames) for nothing
        del models["codec_decoder"]
        models["codec_decoder_stateful"] = (
            "codec_stateful_trt" if s.codec_stateful_backend == "tensorrt" else "codec_stateful_python"
        )
    from triton_qwen3_tts.serving.tts.router import lane_model_names

    written = []  # (model name, its model type's name: codec_decoder, talker, ...)
    for base, src in models.items():
        with open(os.path.join(templates, src, "config.pbtxt.in"), encoding="utf-8") as f:
            text = _substitute(f.read(), values, f"{src}/config.pbtxt.in")
        names = [base] if base == "tts" else lane_model_names(base, lanes)
        for i, name in enumerate(names):
            dst_dir = os.path.join(out_dir, name, "1")
            os.makedirs(dst_dir)
            config = text if len(names) == 1 else _lane_config(text, name, None if cpu else i)
            with open(os.path.join(out_dir, name, "config.pbtxt"), "w", encoding="utf-8") as f:
                f.write(config)
            model_py = os.path.join(templates, src, "1", "model.py")
            if os.path.exists(model_py):
                shutil.copy2(model_py, os.path.join(dst_dir, "model.py"))
            written.append((name, base))
    if s.codec_backend == "tensorrt" and "codec_decoder" in models:
        plan = s.plan or os.path.join(templates, "codec_decoder", "1", "model.plan")
        if not os.path.exists(plan):
            raise RepositoryError(
                f"no TensorRT plan at {plan}: build it with export/build_trt_engine.py "
                "or pass --plan (or use --codec-backend python)"
            )
        for name, base in written:
            if base == "codec_decoder":
                shutil.copy2(plan, os.path.join(out_dir, name, "1", "model.plan"))
    if stateful and s.codec_stateful_backend == "tensorrt":
        for name, base in written:
            if base == "codec_decoder_stateful":
                shutil.copy2(s.stateful_plan, os.path.join(out_dir, name, "1", "model.plan"))
    with open(os.path.join(out_dir, "build.json"), "w") as f:
        json.dump(
            {
                "settings": asdict(s),
                "checkpoint_task_type": cfg.task_type,
                "models": sorted(name for name, _ in written),
                "talker_context": {
                    **asdict(ctx),
                    "native_kv_cache_bytes": kv_cache_bytes(s, cfg, ctx.max_model_len),
                    # vLLM's pool: 0 = gpu_memory_utilization (GPU); on CPU sized by vllm_cpu_kv_cache_bytes
                    "kv_cache_memory_bytes": kv_bytes,
                    "kv_cache_memory_why": kv_why if kv_bytes else "",
                },
            },
            f,
            indent=2,
        )
    return out_dir
