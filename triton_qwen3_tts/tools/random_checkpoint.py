"""Random-weight checkpoints in the official Qwen3-TTS 12 Hz on-disk layout.

Why: the serving stack (loader, vLLM talker, codec engines, Triton repository) must be exercised
on the *real* file layout -- file names, tensor names, shapes and dtypes -- without downloading
the official weights. This module writes such a checkpoint for any preset of :mod:`presets`:

```
config.json, generation_config.json, model.safetensors (bf16), preprocessor_config.json,
vocab.json, merges.txt, tokenizer_config.json,
speech_tokenizer/{config.json, preprocessor_config.json, model.safetensors (fp32)}
```

The tensor list is never written by hand: it is enumerated from the reference modules built on
the meta device (:func:`main_tensor_specs`, :func:`speech_tokenizer_tensor_specs`). The loader
(:mod:`checkpoint`) validates files against the very same enumeration, and the tests compare it
with the parameter counts of the official models.

Two ways of filling the tensors (``method``):

* ``"module"`` (default for small presets, i.e. the tiny ones): build the module on CPU in fp32
  and call the module owner's init helper (``talker.init_random_weights``,
  ``codec.init_random_codec_weights``, ``codec_encoder.init_random_encoder_weights``). Those
  helpers know the semantics of their modules (norms 1, LayerScale 0.01, positive
  ``cluster_usage``...). If a helper does not exist, the per-tensor rules below are used instead.
* ``"fast"`` (default for real sizes): never build the module; for every ``(key, shape)`` draw
  the values from a ``torch.Generator`` seeded with ``sha256(f"{seed}:{file}:{key}")``, in
  fixed-size row chunks, cast each chunk to the file dtype and stream it to disk. Peak memory is
  one chunk (~64 MiB), so the 1.7B checkpoint (3.9 GB bf16) is written without holding it. The
  values follow the key rules of :func:`rule_init_value` (the official init values: norms 1, biases 0,
  ``cluster_usage``/``initialized`` 1, LayerScale 0.01, ConvNeXt gamma 1e-6, SnakeBeta
  alpha = beta = 0, everything else N(0, 0.02); codebook sums N(0, 1)). These are the spec's
  official init values, so a "fast" speech tokenizer decodes to near-silence, unlike
  the "module" one (``codec.init_random_codec_weights`` defaults to audible noise). Measured:
  the 1.7B-Base checkpoint (4.5 GB) is written in ~50 s with a peak RSS of ~0.6 GB.

Both methods are deterministic: the same preset, seed and code give byte-identical files
(``.safetensors`` are written by our own streaming writer, keys sorted, so the byte layout does
not depend on dict order or on the safetensors version).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import shutil
import struct
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch
from torch import nn

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig, SpeechTokenizerConfig
from triton_qwen3_tts.model.tensor_specs import (
    MAIN_DTYPE,
    SPEECH_TOKENIZER_DTYPE,
    TensorSpec,
    build_codec_decoder,
    build_codec_encoder,
    build_main_model,
    count_params,
    main_tensor_specs,
    module_tensor_specs,
    speech_tokenizer_tensor_specs,
)

__all__ = [
    "TensorSpec",
    "MAIN_DTYPE",
    "SPEECH_TOKENIZER_DTYPE",
    "TOP_PREPROCESSOR_CONFIG",
    "build_main_model",
    "build_codec_decoder",
    "build_codec_encoder",
    "module_tensor_specs",
    "main_tensor_specs",
    "speech_tokenizer_tensor_specs",
    "count_params",
    "rule_init_value",
    "write_safetensors",
    "write_random_checkpoint",
    "preset_summary",
]


# Top-level preprocessor_config.json: read by AutoProcessor -> Qwen3TTSProcessor.
TOP_PREPROCESSOR_CONFIG = {"processor_class": "Qwen3TTSProcessor", "padding_side": "left"}

# Presets whose modules have at most this many elements are built on CPU ("module" method).
_MODULE_METHOD_MAX_ELEMENTS = 64_000_000
# Elements drawn per generator call in the "fast" method (fixed: changing it changes the values).
_CHUNK_ELEMENTS = 1 << 24


def _import(module: str):
    """A module of :mod:`triton_qwen3_tts.model` (imported when a writer needs its init helper)."""
    return importlib.import_module(f"triton_qwen3_tts.model.{module}")


# ----------------------------------------------------------------------------------------------
# Values.


def _key_seed(seed: int, file_tag: str, key: str) -> int:
    h = hashlib.sha256(f"{seed}:{file_tag}:{key}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _rule(key: str) -> tuple[str, float]:
    """(kind, value) for a key: ("const", v) or ("normal", std). The official init values."""
    parts = key.split(".")
    leaf, owner = parts[-1], (parts[-2] if len(parts) > 1 else "")
    if leaf in ("cluster_usage", "initialized"):
        return "const", 1.0  # positive usage, or the codebook becomes sum/1e-5
    if leaf in ("embedding_sum", "embed_sum"):
        return "normal", 1.0
    if leaf == "scale" and owner.endswith("layer_scale"):
        return "const", 0.01  # LayerScale
    if leaf == "gamma":
        return "const", 1e-6  # ConvNeXt gamma
    if leaf in ("alpha", "beta"):
        return "const", 0.0  # SnakeBeta log-parameters
    if owner.endswith("norm") or owner.endswith("layernorm"):
        return ("const", 1.0) if leaf == "weight" else ("const", 0.0)
    if leaf == "bias":
        return "const", 0.0
    return "normal", 0.02


def rule_init_value(
    key: str, shape: Sequence[int], dtype: torch.dtype, seed: int, file_tag: str = ""
) -> Iterator[torch.Tensor]:
    """Yield the flat values of one tensor in chunks (the ``"fast"`` method; see module doc)."""
    kind, v = _rule(key)
    n = math.prod(shape)
    if kind == "const" or n == 0:
        for start in range(0, max(n, 1), _CHUNK_ELEMENTS):
            m = min(_CHUNK_ELEMENTS, n - start)
            if m > 0:
                yield torch.full((m,), v, dtype=dtype)
        return
    gen = torch.Generator().manual_seed(_key_seed(seed, file_tag, key))
    for start in range(0, n, _CHUNK_ELEMENTS):
        m = min(_CHUNK_ELEMENTS, n - start)
        chunk = torch.randn(m, generator=gen, dtype=torch.float32)
        chunk.mul_(v)
        yield chunk.to(dtype)


def _rule_init_module(module: nn.Module, seed: int, file_tag: str) -> None:
    """Fill every state_dict tensor of an on-CPU module with :func:`rule_init_value`."""
    with torch.no_grad():
        for key, t in module.state_dict(keep_vars=True).items():
            if not t.is_floating_point():
                continue
            flat = torch.cat(list(rule_init_value(key, tuple(t.shape), t.dtype, seed, file_tag)))
            t.copy_(flat.view(t.shape))


# ----------------------------------------------------------------------------------------------
# safetensors streaming writer.

_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _write_tensor_bytes(f, t: torch.Tensor) -> int:
    t = t.detach().contiguous().reshape(-1)
    if t.numel() == 0:
        return 0
    b = t.view(torch.uint8).numpy()
    f.write(memoryview(b))
    return b.nbytes


def write_safetensors(
    path: str | os.PathLike,
    specs: Sequence[TensorSpec],
    values: Callable[[TensorSpec], Iterable[torch.Tensor]],
    metadata: Optional[Mapping[str, str]] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> None:
    """Write a ``.safetensors`` file one tensor (or chunk) at a time.

    ``values(spec)`` yields the tensor's values (any shape, flattened in order, already in
    ``spec.dtype``). Keys are written sorted, so the bytes do not depend on the input order.
    Written to ``path + ".tmp"`` and renamed, so a crash never leaves a half-written file under
    the final name. ``progress(nbytes)`` is called after each chunk.
    """
    specs = sorted(specs, key=lambda s: s.key)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for s in specs:
        if s.dtype not in _ST_DTYPES:
            raise TypeError(f"{path}: key '{s.key}': dtype {s.dtype} cannot be stored in safetensors")
        header[s.key] = {
            "dtype": _ST_DTYPES[s.dtype],
            "shape": list(s.shape),
            "data_offsets": [offset, offset + s.nbytes],
        }
        offset += s.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # 8-byte alignment of the data section, like safetensors itself
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for s in specs:
            written = 0
            for chunk in values(s):
                if chunk.dtype != s.dtype:
                    raise TypeError(f"{path}: key '{s.key}': value dtype {chunk.dtype} != {s.dtype}")
                n = _write_tensor_bytes(f, chunk)
                written += n
                if progress is not None:
                    progress(n)
            if written != s.nbytes:
                raise ValueError(
                    f"{path}: key '{s.key}': wrote {written} bytes, expected "
                    f"{s.nbytes} for shape {list(s.shape)} {s.dtype}"
                )
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Module ("module" method) helpers.


def _init_with_helper(module: nn.Module, helper: Optional[Callable], seed: int, file_tag: str) -> None:
    if helper is not None:
        helper(module, seed)
    else:
        _rule_init_module(module, seed, file_tag)


def _helper(module: str, name: str) -> Optional[Callable]:
    try:
        return getattr(_import(module), name, None)
    except ImportError:
        return None


def _state_values(state: Mapping[str, torch.Tensor], prefix: str = "") -> Callable:
    def values(spec: TensorSpec):
        t = state[spec.key[len(prefix) :]]
        yield t.detach().to(spec.dtype) if t.is_floating_point() else t.detach()

    return values


def _check_codebooks(specs_and_values: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
    for key, t in specs_and_values:
        if key.endswith("cluster_usage") and not bool((t > 0).all()):
            raise ValueError(
                f"{where}: '{key}' has non-positive entries; the codebook would be "
                f"embedding_sum/1e-5. Fix the init helper."
            )


# ----------------------------------------------------------------------------------------------
# The whole checkpoint.


def _json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False), encoding="utf-8")


class _Progress:
    """tqdm byte counter when asked for (real sizes), otherwise a no-op."""

    def __init__(self, enabled: bool, total: int, desc: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _write_file(path: Path, specs: list[TensorSpec], values: Callable, progress: bool) -> None:
    bar = _Progress(
        progress,
        sum(s.nbytes for s in specs),
        path.name if path.parent.name != "speech_tokenizer" else f"speech_tokenizer/{path.name}",
    )
    try:
        write_safetensors(path, specs, values, progress=bar)
    finally:
        bar.close()


def _choose_method(method: str, specs: list[TensorSpec]) -> str:
    if method not in ("auto", "module", "fast"):
        raise ValueError(f"method must be 'auto', 'module' or 'fast', got {method!r}")
    if method == "auto":
        return "module" if count_params(specs)[1] <= _MODULE_METHOD_MAX_ELEMENTS else "fast"
    return method


_TOKENIZER_CACHE: dict[str, Path] = {}


def _write_tokenizer_files(out: Path) -> None:
    """``text.write_tokenizer_files`` once per process (it takes seconds), then byte copies."""
    if not _TOKENIZER_CACHE or not all(p.exists() for p in _TOKENIZER_CACHE.values()):
        import atexit
        import tempfile

        cache = Path(tempfile.mkdtemp(prefix="qwen3_tts_tokenizer_"))
        atexit.register(shutil.rmtree, cache, True)
        written = _import("text").write_tokenizer_files(cache)
        _TOKENIZER_CACHE.clear()
        _TOKENIZER_CACHE.update({name: Path(path) for name, path in written.items()})
    for name, path in _TOKENIZER_CACHE.items():
        shutil.copyfile(path, out / name)


def _write_main(out: Path, config: Qwen3TTSConfig, seed: int, method: str, progress: bool) -> None:
    specs = main_tensor_specs(config)
    path = out / "model.safetensors"
    if _choose_method(method, specs) == "fast":
        _write_file(path, specs, lambda s: rule_init_value(s.key, s.shape, s.dtype, seed, "model"), progress)
        return
    torch.manual_seed(seed)  # for any init a module does in its constructor
    model = build_main_model(config)
    _init_with_helper(model, _helper("talker", "init_random_weights"), seed, "model")
    _write_file(path, specs, _state_values(model.state_dict()), progress)


def _write_speech_tokenizer(
    out: Path, st_config: SpeechTokenizerConfig, seed: int, method: str, progress: bool
) -> None:
    specs = speech_tokenizer_tensor_specs(st_config)
    path = out / "model.safetensors"
    if _choose_method(method, specs) == "fast":
        _write_file(path, specs, lambda s: rule_init_value(s.key, s.shape, s.dtype, seed, "speech_tokenizer"), progress)
        return
    torch.manual_seed(seed)
    decoder = build_codec_decoder(st_config)
    _init_with_helper(decoder, _helper("codec", "init_random_codec_weights"), seed, "speech_tokenizer")
    encoder = build_codec_encoder(st_config)
    _init_with_helper(encoder, _helper("codec_encoder", "init_random_encoder_weights"), seed + 1, "speech_tokenizer")
    state = {f"decoder.{k}": v for k, v in decoder.state_dict().items()}
    state.update({f"encoder.{k}": v for k, v in encoder.state_dict().items()})
    _check_codebooks(state.items(), str(path))
    _write_file(path, specs, _state_values(state), progress)


def write_random_checkpoint(
    preset: str,
    out_dir: str | os.PathLike,
    seed: int = 0,
    *,
    method: str = "auto",
    progress: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write a random checkpoint of ``preset`` (see :data:`presets.PRESETS`) into ``out_dir``.

    ``method``: ``"auto"`` (module init for presets up to 64M elements per file, else fast),
    ``"module"`` or ``"fast"`` (see module doc). Refuses a non-empty ``out_dir`` unless
    ``overwrite``. Returns ``out_dir``.
    """
    main_dict = presets.main_config(preset)
    st_dict = presets.speech_tokenizer_config(preset)
    config = Qwen3TTSConfig.from_dict(main_dict)
    st_config = SpeechTokenizerConfig.from_dict(st_dict)

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)

    # Small files first: a loader can read the configs while the weights are being written.
    _json(out / "config.json", main_dict)
    _json(out / "generation_config.json", presets.GENERATION_CONFIG)  # 245 bytes, as S7
    _json(out / "preprocessor_config.json", TOP_PREPROCESSOR_CONFIG)
    _write_tokenizer_files(out)
    _json(out / "speech_tokenizer" / "config.json", st_dict)
    _json(out / "speech_tokenizer" / "preprocessor_config.json", presets.SPEECH_TOKENIZER_PREPROCESSOR)

    _write_main(out, config, seed, method, progress)
    _write_speech_tokenizer(out / "speech_tokenizer", st_config, seed, method, progress)
    return out


def write_temp_checkpoint(preset: str, prefix: str = "qwen3-tts-ckpt-", seed: int = 0) -> str:
    """:func:`write_random_checkpoint` of ``preset`` into a new temporary directory; its path
    (``<tmp>/<preset>``). For scripts that take ``--preset`` instead of a checkpoint."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix=prefix)) / preset
    write_random_checkpoint(preset, out, seed, progress=False)
    return str(out)


def preset_summary(preset: str) -> dict:
    """Tensor and parameter counts of a preset's two weight files (meta device, nothing written)."""
    config = Qwen3TTSConfig.from_dict(presets.main_config(preset))
    st_config = SpeechTokenizerConfig.from_dict(presets.speech_tokenizer_config(preset))
    main = main_tensor_specs(config)
    st = speech_tokenizer_tensor_specs(st_config)
    return {
        "preset": preset,
        "tts_model_type": config.tts_model_type,
        "model_tensors": len(main),
        "model_params": sum(s.numel for s in main),
        "model_bytes": sum(s.nbytes for s in main),
        "speech_tokenizer_tensors": len(st),
        "speech_tokenizer_params": sum(s.numel for s in st),
        "speech_tokenizer_bytes": sum(s.nbytes for s in st),
    }
