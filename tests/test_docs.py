"""Documents and comments cite only what exists: files of this repository or public URLs.

Checked text: README.md, export/README.md and docs/**/*.md in full; in the repository's Python,
shell, Dockerfile and Triton-config files, their comments and docstrings. In it:

* a repository path (first part a top-level entry: ``triton_qwen3_tts/serving/tts/service.py``,
  ``docs/design/serving.md``, ``scripts/render_goals.py``; globs, ``{a,b}`` and ``{7..16}``
  expand) names at least one file or folder that exists; a path inside the package
  (``serving/tts/encoders.py``) exists under ``triton_qwen3_tts/``; a Markdown link resolves from
  its document's folder;
* a bare ``*.py`` / ``*.sh`` / ``*.md`` name is the name of a repository file (or of an upstream
  file listed in ``UPSTREAM``);
* a dotted ``triton_qwen3_tts.<module>`` name is a module, or a name defined in one; a module of
  the old flat layout (``RETIRED``) is not named;
* nothing outside the repository is cited: no section number of an outside model spec, no
  operations notes, no issue or pull-request number (link the public page instead), no path under the
  outside ``shared`` folder, not the package's old name (``CITATIONS``, ``OUTSIDE``; ``BAD``
  lists examples).

URLs, absolute paths (``/opt/tritonserver``), ``$VAR/...``, ``~/...``, outputs of commands
(``build/...``: not a top-level entry here) and build products (``PRODUCTS``) are not checked.
"""

from __future__ import annotations

import ast
import io
import itertools
import os
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = "triton_qwen3_tts"

# Top-level entries of the repository that a path in a document may start with.
TOP = {
    PKG,
    ".ci",
    "benchmark",
    "deploy",
    "docker",
    "docs",
    "export",
    "model_repository",
    "requirements",
    "scripts",
    "tests",
    "README.md",
    "Dockerfile",
    "Dockerfile.cu12",
    "pyproject.toml",
    ".pre-commit-config.yaml",
    ".gitignore",
}
# First parts that always name something outside the repository (or gone).
OLD_NAME = "_".join(("qwen3", "tts", "triton"))  # the package's name before the rename
OUTSIDE = {"shared", OLD_NAME}
# Upstream files (https://github.com/QwenLM/Qwen3-TTS, Hugging Face transformers, vLLM, Triton)
# that the text names by their file name.
UPSTREAM = {
    "modeling_qwen3_tts.py",
    "configuration_qwen3_tts.py",
    "modeling_qwen3_tts_tokenizer_v2.py",
    "configuration_qwen3_tts_tokenizer_v2.py",
    "qwen3_tts_model.py",
    "qwen3_tts_tokenizer.py",
    "model.py",
    "sitecustomize.py",
    "speech_vq.py",
    "streaming_decoder.py",
}
# Build products that a document may say where to write (they are not in the repository).
PRODUCTS = (".plan", ".onnx", ".wav")
SKIP_DIRS = {".git", ".venv", ".venv-golden", "build", "out", ".gpu-bundle", ".whl", "__pycache__", ".ruff_cache"}

CITATIONS = [
    (re.compile(r"\bspec(?:ification)?(?:'s)?\s+(?:sections?\s+|§\s*)?\d", re.I), "a section of an outside spec"),
    (re.compile(r"\bspec\s+sections?\b", re.I), "a section of an outside spec"),
    (re.compile(r"§\s*\d"), "a section of an outside document"),
    (re.compile(r"\brunbook\b", re.I), "an outside runbook"),
    (re.compile(r"\bissues?\s+#?\d+", re.I), "an issue number"),
    (re.compile(r"\b(?:PRs?|pull requests?)\s*#?\d+", re.I), "a pull request number"),
    (re.compile(rf"\b{OLD_NAME}\b"), "the old package name"),
]

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
PATH = re.compile(r"(?<![\w./$~:@-])((?:\.\./)*[\w.*{}<>-]+(?:/[\w.*{}<>,-]+)+/?)")
BARE = re.compile(r"(?<![\w./$~:@-])([\w-]+\.(?:py|sh|md))\b(?!/)")
DOTTED = re.compile(rf"(?<![\w.]){PKG}(?:\.\w+)+")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
# Modules of the old flat layout, where the text names them as modules (followed by a dot and a
# name, or by a closing backtick; also the relative ``.name`` of Sphinx roles).
RETIRED = re.compile(
    r"(?<![\w/-])(?<!\w\.)(streaming|codec_stateful|codec_runtime|codec_batch|stateful_graphs|talker_engines|"
    r"talker_service|tts_service|vllm_plugin|vllm_talker|native_engine|onnx_export)(?=\.[A-Za-z_]|`)"
)


def _tracked():
    """Repository-relative paths of every file (git's view, untracked files included, when git is there)."""
    try:
        r = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        files = [f for f in r.stdout.splitlines() if (ROOT / f).exists()]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            rel = Path(dirpath).relative_to(ROOT)
            files += [(rel / f).as_posix() for f in filenames]
    return sorted(set(files))


FILES = _tracked()
NAMES = {f.rsplit("/", 1)[-1] for f in FILES}


def _expand(path: str):
    """Brace expansion: ``a{1,2}`` -> a1, a2; ``run{7..9}`` -> run7, run8, run9."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        yield path
        return
    body = m.group(1)
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    opts = [str(i) for i in range(int(r.group(1)), int(r.group(2)) + 1)] if r else body.split(",")
    for o in opts:
        yield from _expand(path[: m.start()] + o + path[m.end() :])


def _exists(rel: str, base: Path = ROOT) -> bool:
    rel = re.sub(r"<[^<>]*>", "*", rel).rstrip("/")
    for p in _expand(rel):
        if any(ch in p for ch in "*?["):
            if any(base.glob(p)):
                return True
        elif (base / p).exists():
            return True
    return False


def _module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        f = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if f.exists():
            rest = parts[n:]
            if not rest:
                return True
            # the next part is a name defined in that module (a class, function or assignment)
            return (
                re.search(rf"^\s*(?:class|def|async def)\s+{rest[0]}\b|^\s*{rest[0]}\b\s*[:=]", f.read_text(), re.M)
                is not None
            )
    return False


def problems(text: str, where: str = "text", base: Path = ROOT) -> list:
    """What ``text`` (from a file in ``base``) cites that does not exist, one line per finding."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        at = f"{where}:{i}"
        for m in MD_LINK.finditer(line):
            target = m.group(1).split("#", 1)[0]
            if target and not URL.match(target) and not target.startswith("mailto:") and not _exists(target, base):
                out.append(f"{at}: link to a missing file: {m.group(1)!r}")
        line = URL.sub(" ", line)
        seen = []  # one finding per citation, however many patterns match it
        for rx, what in CITATIONS:
            for m in rx.finditer(line):
                if not any(a < m.end() and m.start() < b for a, b in seen):
                    seen.append(m.span())
                    out.append(f"{at}: cites {what}: {m.group(0)!r}")
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".,:;")
            first = path.split("/", 1)[0]
            if first in OUTSIDE or (first == ".." and "shared" in path):
                out.append(f"{at}: cites a path outside the repository: {path!r}")
            elif first in TOP:
                if not _exists(path) and not path.endswith(PRODUCTS):
                    out.append(f"{at}: no such path in the repository: {path!r}")
            elif first == "..":
                if not _exists(path, base):
                    out.append(f"{at}: no such path: {path!r}")
            elif first in {"serving", "model", "engines", "export", "tools"} and path.endswith((".py", "/")):
                if not _exists(f"{PKG}/{path}"):
                    out.append(f"{at}: no such path in the package: {path!r}")
        for m in BARE.finditer(line):
            name = m.group(1)
            if name not in NAMES and name not in UPSTREAM:
                out.append(f"{at}: no file of this name in the repository: {name!r}")
        for m in RETIRED.finditer(line):
            out.append(f"{at}: names a module of the old layout: {m.group(1)!r}")
        for m in DOTTED.finditer(line):
            if not _module_exists(m.group(0)):
                out.append(f"{at}: no such module or name: {m.group(0)!r}")
    return out


# ----------------------------------------------------------------------------- what is checked


def _docs():
    yield ROOT / "README.md"
    yield ROOT / "export" / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))


def _python_notes(src: str) -> str:
    """Comments and docstrings of a Python source, each on its own line number (others blank)."""
    lines = [""] * (src.count("\n") + 2)

    def put(start, text):
        for k, t in enumerate(text.splitlines()):
            if start + k < len(lines):
                lines[start + k] += " " + t

    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            put(tok.start[0] - 1, tok.string)
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                put(first.lineno - 1, first.value.value)
    return "\n".join(lines)


def _hash_comments(src: str) -> str:
    """``#`` comments of a shell, Dockerfile or Triton-config file (a Dockerfile's ``# syntax=``
    parser directive names an image, not a path)."""
    return "\n".join(
        line[line.index("#") :] if "#" in line and not line.startswith("# syntax=") else "" for line in src.splitlines()
    )


def _sources():
    for rel in sorted(FILES):
        p = ROOT / rel
        if not p.is_file() or rel.startswith("docs/bench/"):
            continue
        name = p.name
        if name.endswith(".py"):
            yield rel, _python_notes(p.read_text())
        elif name.endswith((".sh", ".pbtxt.in", ".toml", ".yaml")) or name.startswith("Dockerfile") or rel == ".ci/run":
            yield rel, _hash_comments(p.read_text())


DOCS = [p for p in _docs() if p.exists()]
SOURCES = list(_sources())


@pytest.mark.parametrize("path", DOCS, ids=[p.relative_to(ROOT).as_posix() for p in DOCS])
def test_document_cites_only_what_exists(path):
    found = problems(path.read_text(), path.relative_to(ROOT).as_posix(), path.parent)
    assert not found, "\n".join(found)


def test_comments_and_docstrings_cite_only_what_exists():
    found = list(itertools.chain.from_iterable(problems(text, rel, (ROOT / rel).parent) for rel, text in SOURCES))
    assert not found, "\n".join(found)


# ----------------------------------------------------------------------------- the check can fail

BAD = [
    "The prompt layout follows spec 3.2.",
    "See spec section 6 for the key names.",
    "Process hygiene (runbook C3).",
    "Fixed in issue 14; see also (Issue 9).",
    "the official default (vLLM-Omni PR #2480)",
    "started by `scripts/serve.sh`",
    "see docs/design/no-such-page.md",
    f"the loader (`{OLD_NAME}/checkpoint.py`)",
    "the recipe in shared/runbook/cpu_stack.md",
    "Run `python -m triton_qwen3_tts.serving.launcher`.",
    "`triton_qwen3_tts.model.codec.NoSuchDecoder`",
    "the old `codec_runtime.py:decode`",
    "built by `streaming.ChunkScheduler` and `vllm_plugin`",
    "raw outputs: docs/bench/run{7..8}_nothing/",
    "[the page](design/missing.md)",
]
GOOD = [
    "https://github.com/QwenLM/Qwen3-TTS/blob/main/qwen_tts/core/models/modeling_qwen3_tts.py",
    "the public model card https://huggingface.co/Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Triton's backends in /opt/tritonserver/backends/python, written to $OUT/gpu.txt",
    "python scripts/build_model_repository.py --out build/repo",
    "the adapters `model_repository/*/1/model.py`, raw outputs in docs/bench/run{7..9}_*/",
    "`triton_qwen3_tts/serving/tts/service.py` and serving/tts/encoders.py",
    "[the page](docs/design/serving.md), docs/design/stateful-codec.md, `scripts/render_goals.py`",
    "`python -m triton_qwen3_tts.tools.launcher`, triton_qwen3_tts.model.codec.CodecDecoder",
    "a tensor spec of 16 codes; the issue of padding; `spec.dtype`",
    "fixed upstream (https://github.com/triton-inference-server/server/pull/8078, issues/12)",
]


@pytest.mark.parametrize("text", BAD)
def test_a_planted_bad_citation_is_found(text):
    assert problems(text), text


@pytest.mark.parametrize("text", GOOD)
def test_good_citations_pass(text):
    assert problems(text) == []


def test_python_comments_and_docstrings_are_read():
    src = '"""Module (spec 1.3)."""\nx = "spec 9.9 in a string is code"  # see runbook C3\n'
    found = problems(_python_notes(src), "m.py")
    assert len(found) == 2 and "m.py:1" in found[0] and "m.py:2" in found[1], found
