"""The optional ``model`` extra (torch, transformers, safetensors; pyproject.toml says why it is
optional): commands import it after reading their command line, so ``--help`` works without it,
and say what to install when it is missing."""

from __future__ import annotations

import importlib

MODEL_EXTRA = ("torch", "transformers", "safetensors")
INSTALL_HINT = "pip install 'triton-qwen3-tts[model]'"


def is_model_extra(e: ModuleNotFoundError) -> bool:
    """Whether ``e`` is a module of the ``model`` extra that is not installed."""
    return (e.name or "").split(".")[0] in MODEL_EXTRA


def import_model_extra(module: str, what: str):
    """``importlib.import_module(module)``; exits with a message naming the extra when a module of it
    is missing (``what``: the command or step that needs it)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if not is_model_extra(e):
            raise
        raise SystemExit(f"error: {what} needs {e.name}, part of the [model] extra: {INSTALL_HINT}") from None
