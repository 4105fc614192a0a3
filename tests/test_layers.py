"""The package's import direction (docs/design/package.md, "Layers"), checked on the source.

Layers, lowest first: ``model`` <- ``engines`` and ``export`` <- ``serving`` <- ``gateway`` <-
``tools``. A module may import its own layer and the layers below, never one above; ``engines.vllm`` and
``engines.native`` never import each other; only the ``serving/*/triton.py`` modules import
``triton_python_backend_utils``; ``model`` imports neither vLLM nor Triton. Imports inside
functions count too (every ``import`` node of the file is read).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = "triton_qwen3_tts"
ROOT = Path(__file__).resolve().parents[1] / PKG
RANK = {"model": 0, "engines": 1, "export": 1, "serving": 2, "gateway": 3, "tools": 4}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join([PKG] + parts), path


def _imports(name: str, path: Path):
    """Every module name ``path`` imports (relative imports resolved), with its line."""
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, node.lineno
            for a in node.names:  # ``from pkg import module``
                yield f"{mod}.{a.name}", node.lineno


def _layer(module: str):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == PKG else None


MODULES = list(_modules())


def test_every_module_is_in_a_layer():
    stray = [m for m, p in MODULES if m != PKG and _layer(m) not in RANK]
    assert not stray, f"modules outside the layers {sorted(RANK)}: {stray}"


@pytest.mark.parametrize("name,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_down(name, path):
    layer = _layer(name)
    problems = []
    for mod, line in _imports(name, path):
        where = f"{path.relative_to(ROOT.parent)}:{line} imports {mod}"
        if mod == "triton_python_backend_utils" and not (
            name.startswith(f"{PKG}.serving.") and name.endswith(".triton")
        ):
            problems.append(f"{where}: only serving/*/triton.py may import the Triton Python backend")
        if layer == "model" and mod.split(".")[0] in ("vllm", "triton_python_backend_utils", "tritonclient"):
            problems.append(f"{where}: the model layer is plain PyTorch")
        target = _layer(mod)
        if layer is None or target is None or target not in RANK:
            continue
        if RANK[target] > RANK[layer] or (RANK[target] == RANK[layer] and target != layer):
            problems.append(f"{where}: layer {layer} may not import layer {target}")
        for a, b in (("vllm", "native"), ("native", "vllm")):
            if name.startswith(f"{PKG}.engines.{a}") and mod.startswith(f"{PKG}.engines.{b}"):
                problems.append(f"{where}: the {a} engine may not import the {b} engine")
    assert not problems, "\n".join(problems)


def test_the_check_sees_an_upward_import(tmp_path):
    """The walker resolves a relative import of a layer above (so the test above can fail)."""
    f = tmp_path / "checkpoint.py"
    f.write_text("from ..tools.random_checkpoint import TensorSpec\n")
    got = {m for m, _ in _imports(f"{PKG}.model.checkpoint", f)}
    assert f"{PKG}.tools.random_checkpoint" in got
    assert _layer(f"{PKG}.tools.random_checkpoint") == "tools"
