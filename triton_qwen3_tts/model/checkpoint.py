"""Load a Qwen3-TTS 12 Hz checkpoint in the official Hugging Face layout.

Why a validation pass before loading: a wrong or partial checkpoint (a missing file, a tensor of
another model size, a renamed key) otherwise fails deep inside ``load_state_dict`` or, worse,
loads and produces noise. :func:`validate_checkpoint` reads only JSON files and safetensors
*headers* (no tensor data), builds the reference modules on the meta device, and compares the two
key by key. All problems of a file are reported in one :class:`CheckpointError` that names the
file, the key and the expected vs found shape.

Loading then reads tensor by tensor (``safetensors.safe_open``) into modules whose parameters
were created on the meta device, with ``load_state_dict(strict=True, assign=True)``: the
parameters are never allocated twice, and non-persistent buffers (rotary tables) are computed
normally on CPU.

Dtypes: the main model stays bf16 as shipped unless ``dtype`` is given (tests use float32); the
speech-tokenizer decoder/encoder always load in fp32 (the speech tokenizer ships in fp32).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn

from triton_qwen3_tts.model.config import ConfigError, GenerationDefaults, Qwen3TTSConfig, SpeechTokenizerConfig
from triton_qwen3_tts.model.tensor_specs import (
    TensorSpec,
    build_codec_decoder,
    build_codec_encoder,
    build_main_model,
    main_tensor_specs,
    speech_tokenizer_tensor_specs,
)

__all__ = [
    "CheckpointError",
    "LoadedCheckpoint",
    "REQUIRED_FILES",
    "TOKENIZER_FILES",
    "SPEECH_TOKENIZER_FILES",
    "OPTIONAL_FILES",
    "load_talker_config",
    "load_speech_tokenizer_config",
    "load_generation_defaults",
    "read_safetensors_header",
    "compare_header",
    "validate_checkpoint",
    "load_checkpoint",
    "load_codec_decoder",
    "load_reference_encoders",
]

log = logging.getLogger(__name__)

# The files of a released checkpoint, e.g.
# https://huggingface.co/Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice/tree/main.
# generation_config.json is optional: the official wrapper falls back to its
# hard-coded defaults (GenerationDefaults, max_new_tokens 2048) with a warning from us.
MAIN_FILES = ("config.json", "model.safetensors")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
SPEECH_TOKENIZER_FILES = (
    "speech_tokenizer/config.json",
    "speech_tokenizer/preprocessor_config.json",
    "speech_tokenizer/model.safetensors",
)
REQUIRED_FILES = MAIN_FILES + TOKENIZER_FILES + SPEECH_TOKENIZER_FILES
OPTIONAL_FILES = ("generation_config.json", "preprocessor_config.json")

_MAX_LISTED = 20  # problems listed per error message


class CheckpointError(ConfigError):
    """The checkpoint directory does not match the layout its own config.json describes."""


@dataclass
class LoadedCheckpoint:
    """Everything :func:`load_checkpoint` read from a checkpoint directory."""

    path: Path
    config: Qwen3TTSConfig
    generation: GenerationDefaults
    speech_tokenizer_config: Optional[SpeechTokenizerConfig]
    model: nn.Module  # talker.Qwen3TTSModel: .talker and .speaker_encoder (Base only)
    decoder: Optional[nn.Module]  # codec.CodecDecoder, fp32
    encoder: Optional[nn.Module]  # codec_encoder (Mimi), fp32; only with load_encoder=True
    tokenizer: Any  # text.load_text_tokenizer(path); None with load_tokenizer=False

    @property
    def talker(self) -> nn.Module:
        return self.model.talker

    @property
    def speaker_encoder(self) -> Optional[nn.Module]:
        return getattr(self.model, "speaker_encoder", None)


# ----------------------------------------------------------------------------------------------
# Configs.


def load_talker_config(path: str | os.PathLike) -> Qwen3TTSConfig:
    """``config.json`` of a checkpoint directory (or the file itself), typed. Reads nothing else."""
    p = Path(path)
    return Qwen3TTSConfig.from_file(p / "config.json" if p.is_dir() else p)


def load_speech_tokenizer_config(path: str | os.PathLike) -> SpeechTokenizerConfig:
    """``speech_tokenizer/config.json`` of a checkpoint directory."""
    return SpeechTokenizerConfig.from_file(Path(path) / "speech_tokenizer" / "config.json")


def load_generation_defaults(path: str | os.PathLike) -> GenerationDefaults:
    """The sampling defaults of a checkpoint directory (``generation_config.json`` over the official
    wrapper's defaults; the wrapper's defaults alone when the file is missing)."""
    return _load_generation(Path(path))


def _load_generation(root: Path) -> GenerationDefaults:
    p = root / "generation_config.json"
    if not p.exists():
        log.warning("%s is missing; using the wrapper defaults (max_new_tokens=2048)", p)
        return GenerationDefaults()
    return GenerationDefaults.from_file(p)


# ----------------------------------------------------------------------------------------------
# safetensors headers.

_ST_KIND = {
    "F64": "float",
    "F32": "float",
    "F16": "float",
    "BF16": "float",
    "F8_E4M3": "float",
    "F8_E5M2": "float",
    "I64": "int",
    "I32": "int",
    "I16": "int",
    "I8": "int",
    "U8": "int",
    "U16": "int",
    "U32": "int",
    "U64": "int",
    "BOOL": "bool",
}


def _torch_kind(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float"
    return "bool" if dtype == torch.bool else "int"


def read_safetensors_header(path: str | os.PathLike) -> dict[str, tuple[tuple, str]]:
    """``{key: (shape, dtype string)}`` from a ``.safetensors`` header, without reading data."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            size = path.stat().st_size
            if n > min(size - 8, 100 << 20):
                raise CheckpointError(
                    f"{path}: not a safetensors file (header length {n} is larger than the file, {size} bytes)"
                )
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise CheckpointError(f"missing file: {path}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a safetensors file (bad JSON header: {e})") from None
    out = {}
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        out[key] = (tuple(int(s) for s in info["shape"]), str(info["dtype"]))
        end = max(end, int(info["data_offsets"][1]))
    if 8 + n + end > size:
        raise CheckpointError(f"{path}: truncated: the header describes {8 + n + end} bytes, the file has {size}")
    return out


def _fmt_shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def compare_header(
    header: dict[str, tuple[tuple, str]],
    specs: Sequence[TensorSpec],
    prefix: str = "",
    ignore_prefixes: Sequence[str] = (),
) -> list[str]:
    """Problems (one line each) of a safetensors header against the expected tensor specs.

    Only keys starting with ``prefix`` are considered, minus ``ignore_prefixes`` (e.g. the
    speech-tokenizer ``encoder.*`` keys when the encoder is not loaded). Dtypes are compared by
    class (float / int / bool): a float checkpoint of another precision loads fine.
    """
    expected = {s.key: s for s in specs}
    problems = []
    for key, s in expected.items():
        if key not in header:
            problems.append(f"missing key '{key}' (expected shape {_fmt_shape(s.shape)})")
            continue
        shape, dt = header[key]
        if tuple(shape) != tuple(s.shape):
            problems.append(f"key '{key}': expected shape {_fmt_shape(s.shape)}, found {_fmt_shape(shape)}")
        kind = _ST_KIND.get(dt, dt)
        if kind != _torch_kind(s.dtype):
            problems.append(f"key '{key}': expected a {_torch_kind(s.dtype)} tensor ({s.dtype}), found dtype {dt}")
    for key, (shape, _) in sorted(header.items()):
        if not key.startswith(prefix) or any(key.startswith(p) for p in ignore_prefixes):
            continue
        if key not in expected:
            problems.append(f"unexpected key '{key}' (shape {_fmt_shape(shape)})")
    return problems


def _raise_problems(file: Path, problems: list[str], what: str) -> None:
    if not problems:
        return
    lines = problems[:_MAX_LISTED]
    more = len(problems) - len(lines)
    msg = (
        f"{file}: {len(problems)} problem(s) against the {what}:\n  - "
        + "\n  - ".join(lines)
        + (f"\n  ... and {more} more" if more > 0 else "")
    )
    raise CheckpointError(msg)


# ----------------------------------------------------------------------------------------------
# Validation.


def _check_files(root: Path, load_speech_tokenizer: bool, load_encoder: bool, load_tokenizer: bool) -> None:
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {root}")
    need = list(MAIN_FILES)
    if load_tokenizer:
        need += TOKENIZER_FILES
    if load_speech_tokenizer or load_encoder:
        need += SPEECH_TOKENIZER_FILES
    missing = [f for f in need if not (root / f).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {root} is incomplete: missing file(s) {', '.join(missing)}. Required"
            f": {', '.join(REQUIRED_FILES)}; optional: {', '.join(OPTIONAL_FILES)}."
        )


def validate_checkpoint(
    path: str | os.PathLike,
    *,
    load_speech_tokenizer: bool = True,
    load_encoder: bool = False,
    load_tokenizer: bool = True,
) -> tuple[Qwen3TTSConfig, Optional[SpeechTokenizerConfig]]:
    """Check files, configs and every tensor header of a checkpoint; load no tensor data.

    Returns the parsed configs. Raises :class:`CheckpointError` (a ``ConfigError``) with one
    message per file listing every missing/unexpected key and wrong shape or dtype class.
    """
    root = Path(path)
    _check_files(root, load_speech_tokenizer, load_encoder, load_tokenizer)
    config = load_talker_config(root)
    model_file = root / "model.safetensors"
    _raise_problems(
        model_file,
        compare_header(read_safetensors_header(model_file), main_tensor_specs(config)),
        f"layout of config.json (tts_model_type={config.tts_model_type!r}, hidden_size={config.talker.hidden_size})",
    )
    st_config = None
    if load_speech_tokenizer or load_encoder:
        st_config = load_speech_tokenizer_config(root)
        st_file = root / "speech_tokenizer" / "model.safetensors"
        header = read_safetensors_header(st_file)
        specs = speech_tokenizer_tensor_specs(st_config, decoder=load_speech_tokenizer, encoder=load_encoder)
        ignore = (() if load_speech_tokenizer else ("decoder.",)) + (() if load_encoder else ("encoder.",))
        _raise_problems(
            st_file, compare_header(header, specs, ignore_prefixes=ignore), "layout of speech_tokenizer/config.json"
        )
    return config, st_config


# ----------------------------------------------------------------------------------------------
# Loading.


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Create parameters on the meta device, buffers on CPU (as accelerate's init_empty_weights).

    Parameters are replaced by the checkpoint's tensors anyway; building them on the meta device
    skips their random init and never holds two copies. Buffers stay real so that
    non-persistent ones (rotary inv_freq, not in the checkpoint) are computed normally.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            module._parameters[name] = nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def _read_state(
    file: Path, keys: Sequence[str], strip: str, device: str | torch.device, dtype: Optional[torch.dtype]
) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    state = {}
    with safe_open(str(file), framework="pt", device="cpu") as f:
        for key in keys:
            t = f.get_tensor(key)
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            state[key[len(strip) :]] = t.to(device)
    return state


def _assign(module: nn.Module, state: dict[str, torch.Tensor], file: Path, device: str | torch.device) -> nn.Module:
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:  # validated before, so this is a module/layout bug
        raise CheckpointError(f"{file}: load_state_dict failed: {e}") from None
    module.to(device)
    left = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.device.type == "meta"]
    if left:
        raise CheckpointError(
            f"{file}: tensors not in the checkpoint stayed uninitialised on the meta device: {', '.join(left[:10])}"
        )
    module.eval()
    module.requires_grad_(False)
    return module


def _build_and_load(
    build, file: Path, keys: Sequence[str], strip: str, device: str | torch.device, dtype: Optional[torch.dtype]
) -> nn.Module:
    with _params_on_meta():
        module = build()
    return _assign(module, _read_state(file, keys, strip, device, dtype), file, device)


def load_codec_decoder(
    path: str | os.PathLike, device: str | torch.device = "cpu", st_config: Optional[SpeechTokenizerConfig] = None
) -> nn.Module:
    """Only the speech-tokenizer decoder (fp32) of a checkpoint directory, validated first."""
    root = Path(path)
    st_config = st_config or load_speech_tokenizer_config(root)
    file = root / "speech_tokenizer" / "model.safetensors"
    specs = speech_tokenizer_tensor_specs(st_config, decoder=True, encoder=False)
    _raise_problems(
        file,
        compare_header(read_safetensors_header(file), specs, ignore_prefixes=("encoder.",)),
        "layout of speech_tokenizer/config.json",
    )
    return _build_and_load(
        lambda: build_codec_decoder(st_config), file, [s.key for s in specs], "decoder.", device, torch.float32
    )


def load_reference_encoders(
    path: str | os.PathLike, device: str | torch.device = "cpu", speaker_dtype: torch.dtype = torch.float32
) -> tuple[nn.Module, nn.Module]:
    """Only the Base model's speaker encoder and the speech-tokenizer encoder (fp32), validated
    first: what a server needs to turn reference audio into a prompt, without the talker."""
    from triton_qwen3_tts.model.speaker_encoder import SpeakerEncoder

    root = Path(path)
    config = load_talker_config(root)
    if config.speaker_encoder is None:
        raise CheckpointError(f"{root}: {config.task_type} checkpoint has no speaker encoder (Base models only)")
    main_file = root / "model.safetensors"
    specs = [s for s in main_tensor_specs(config) if s.key.startswith("speaker_encoder.")]
    header = {k: v for k, v in read_safetensors_header(main_file).items() if k.startswith("speaker_encoder.")}
    _raise_problems(main_file, compare_header(header, specs), "speaker_encoder_config of config.json")
    speaker = _build_and_load(
        lambda: SpeakerEncoder(config.speaker_encoder),
        main_file,
        [s.key for s in specs],
        "speaker_encoder.",
        device,
        speaker_dtype,
    )
    st_config = load_speech_tokenizer_config(root)
    st_file = root / "speech_tokenizer" / "model.safetensors"
    st_specs = speech_tokenizer_tensor_specs(st_config, decoder=False, encoder=True)
    _raise_problems(
        st_file,
        compare_header(read_safetensors_header(st_file), st_specs, ignore_prefixes=("decoder.",)),
        "layout of speech_tokenizer/config.json",
    )
    codec = _build_and_load(
        lambda: build_codec_encoder(st_config), st_file, [s.key for s in st_specs], "encoder.", device, torch.float32
    )
    return speaker, codec


def load_checkpoint(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: Optional[torch.dtype] = None,
    load_speech_tokenizer: bool = True,
    load_encoder: bool = False,
    load_tokenizer: bool = True,
) -> LoadedCheckpoint:
    """Validate, then load a checkpoint directory in the official layout.

    - ``dtype``: the main model's dtype; ``None`` keeps the file's (bf16).
    - ``load_speech_tokenizer``: load the codec decoder (fp32).
    - ``load_encoder``: also the Mimi encoder (fp32), needed only for Base ICL prompts.
    - ``load_tokenizer``: the text tokenizer via ``text.load_text_tokenizer``.
    """
    root = Path(path)
    config, st_config = validate_checkpoint(
        root, load_speech_tokenizer=load_speech_tokenizer, load_encoder=load_encoder, load_tokenizer=load_tokenizer
    )
    generation = _load_generation(root)

    model_file = root / "model.safetensors"
    model = _build_and_load(
        lambda: build_main_model(config), model_file, [s.key for s in main_tensor_specs(config)], "", device, dtype
    )

    decoder = encoder = None
    st_file = root / "speech_tokenizer" / "model.safetensors"
    if load_speech_tokenizer:
        keys = [s.key for s in speech_tokenizer_tensor_specs(st_config, encoder=False)]
        decoder = _build_and_load(
            lambda: build_codec_decoder(st_config), st_file, keys, "decoder.", device, torch.float32
        )
    if load_encoder:
        keys = [s.key for s in speech_tokenizer_tensor_specs(st_config, decoder=False)]
        encoder = _build_and_load(
            lambda: build_codec_encoder(st_config), st_file, keys, "encoder.", device, torch.float32
        )

    tokenizer = None
    if load_tokenizer:
        from triton_qwen3_tts.model.text import load_text_tokenizer

        tokenizer = load_text_tokenizer(root)

    return LoadedCheckpoint(
        path=root,
        config=config,
        generation=generation,
        speech_tokenizer_config=st_config,
        model=model,
        decoder=decoder,
        encoder=encoder,
        tokenizer=tokenizer,
    )
