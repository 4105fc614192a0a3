"""The console commands (pyproject.toml ``[project.scripts]``) and what they tell the user.

Each command's ``--help`` exits 0 without torch, transformers, safetensors, vLLM or tritonserver
(they are imported only after the command line is read); the repository builder picks the device
and sizes the CPU KV cache itself and says so; the launcher shows progress while it waits and the
log lines that carry the cause when the server fails. tests/test_install.py runs the same commands
from a fresh ``pip install``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.serving.repository import (
    CPU_KV_CACHE_FLOOR,
    RepositoryError,
    RepositorySettings,
    build_repository,
    vllm_cpu_kv_cache_bytes,
)
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving import repository
from triton_qwen3_tts.tools import launcher

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]

# Fails the import of the model extra and of the serving stacks, as in an environment without them.
BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = ("torch", "transformers", "safetensors", "vllm", "tritonserver", "onnxruntime", "pytriton")
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
    sys.meta_path.insert(0, Block())
""")


def test_the_commands_are_the_documented_ones():
    assert sorted(SCRIPTS) == sorted(
        [
            "qwen3-tts-serve",
            "qwen3-tts-client",
            "qwen3-tts-gateway",
            "qwen3-tts-build-repository",
            "qwen3-tts-random-checkpoint",
            "qwen3-tts-bench-service",
            "qwen3-tts-bench-gateway",
            "qwen3-tts-bench-model",
            "qwen3-tts-bench-codec",
        ]
    )
    readme = (ROOT / "README.md").read_text()
    for name in (
        "qwen3-tts-serve",
        "qwen3-tts-client",
        "qwen3-tts-gateway",
        "qwen3-tts-build-repository",
        "qwen3-tts-random-checkpoint",
    ):
        assert name in readme, name


def test_every_help_exits_0_without_the_model_extra_or_serving_stacks():
    code = BLOCKER + textwrap.dedent(f"""
        import contextlib, importlib, io, json
        out = {{}}
        for name, target in {SCRIPTS!r}.items():
            module, func = target.split(":")
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    getattr(importlib.import_module(module), func)(["--help"])
                code = "returned"
            except SystemExit as e:
                code = e.code
            out[name] = [code, buf.getvalue()]
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    helps = json.loads(r.stdout.splitlines()[-1])
    for name, (code, text) in helps.items():
        assert code == 0 and "usage:" in text, (name, code, text[-500:])
        assert text.startswith(f"usage: {name} "), text[:80]
    flat = {name: " ".join(text.split()) for name, (_, text) in helps.items()}  # argparse wraps lines
    for v in ("auto, gpu, cpu", "auto, tensorrt, python", "vllm, native", "windowed, stateful"):
        assert v in flat["qwen3-tts-build-repository"], v
    for p in presets.PRESETS:
        assert p in flat["qwen3-tts-random-checkpoint"]
    assert "auto,image,wheel" in flat["qwen3-tts-serve"] and "QWEN3_TTS_CACHE" in flat["qwen3-tts-serve"]
    for v in [*presets.SPEAKERS, *presets.LANGUAGES, "float32", "int16", "CustomVoice", "VoiceDesign", "Base"]:
        assert v in flat["qwen3-tts-client"], v


def test_packages_listed_in_pyproject_are_the_package_folders():
    """pyproject.toml lists the packages (the templates' package-dir mapping rules out
    packages.find): a new subpackage must be added there, or the wheel leaves it out."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "triton_qwen3_tts").rglob("__init__.py")} | {
        "triton_qwen3_tts.templates"
    }
    assert listed == found
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"triton_qwen3_tts.templates": "model_repository"}
    for pattern in PYPROJECT["tool"]["setuptools"]["package-data"]["triton_qwen3_tts.templates"]:
        assert list((ROOT / "model_repository").glob(pattern)), pattern
    shipped = {
        str(p.relative_to(ROOT / "model_repository"))
        for pattern in PYPROJECT["tool"]["setuptools"]["package-data"]["triton_qwen3_tts.templates"]
        for p in (ROOT / "model_repository").glob(pattern)
    }
    tracked = subprocess.run(
        ["git", "ls-files", "model_repository"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    if tracked:  # every template the repository keeps ships in the wheel
        assert {t.removeprefix("model_repository/") for t in tracked} <= shipped


def test_builder_choices_are_the_ones_the_settings_accept(tmp_path):
    """Every allowed value of an enumerated setting (serving/settings.py) passes validation on its
    own, and any other value is refused naming the setting."""
    from triton_qwen3_tts.serving.settings import SETTINGS

    ckpt = _ckpt(tmp_path)
    for x in (x for x in SETTINGS if x.choices):
        for v in x.choices:
            if v == "auto":
                continue
            s = RepositorySettings(checkpoint=ckpt, codec_backend="python", device="cpu")
            setattr(s, x.name, v)
            try:
                s.validate()
            except RepositoryError as e:  # allowed, but not in this combination
                assert not str(e).startswith(f"{x.name}: must be one of"), (x.name, v, e)
        s = RepositorySettings(checkpoint=ckpt, codec_backend="python", device="cpu")
        setattr(s, x.name, "bogus")
        with pytest.raises(RepositoryError, match=f"^{x.name}: must be one of"):
            s.validate()


def _ckpt(tmp_path, preset="tiny") -> str:
    d = tmp_path / f"ckpt-{preset}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(presets.main_config(preset)))
    return str(d)


def test_detect_device():
    assert repository.detect_device({"CUDA_VISIBLE_DEVICES": ""})[0] == "cpu"
    assert repository.detect_device({"CUDA_VISIBLE_DEVICES": "-1"})[0] == "cpu"
    device, why = repository.detect_device({})
    assert device in ("gpu", "cpu") and why
    assert repository.pick_codec_backend("cpu", "")[0] == "python"
    assert repository.pick_codec_backend("gpu", "x.plan") == ("tensorrt", "--plan x.plan")


def test_builder_says_what_it_picked_on_a_machine_without_gpu(tmp_path):
    out = tmp_path / "repo"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_model_repository.py"), "--checkpoint", _ckpt(tmp_path)]
        + ["--out", str(out), "--max-frames-limit", "1024", "--max-text-chars", "500", "--max-instruct-chars", "200"]
        + ["--default-max-frames", "1024", "--max-num-seqs", "8"],
        capture_output=True,
        text=True,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES="", QWEN3_TTS_CACHE=str(tmp_path / "cache")),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "device: cpu (CUDA_VISIBLE_DEVICES=''" in r.stdout and "codec backend: python" in r.stdout
    assert "talker KV cache (vLLM): 32 MiB" in r.stdout and str(tmp_path / "cache" / "vllm") in r.stdout
    assert f"serve it: qwen3-tts-serve --model-repository {out}" in r.stdout
    talker = (out / "talker" / "config.pbtxt").read_text()
    assert f'key: "kv_cache_memory_bytes" value: {{ string_value: "{CPU_KV_CACHE_FLOOR}" }}' in talker
    assert 'key: "device" value: { string_value: "cpu" }' in talker


def test_cpu_kv_cache_default_is_sized_to_the_model(tmp_path):
    ckpt = _ckpt(tmp_path)
    cfg = Qwen3TTSConfig.from_file(os.path.join(ckpt, "config.json"))

    def built(**kw):
        out = Path(
            build_repository(RepositorySettings(checkpoint=ckpt, codec_backend="python", **kw), str(tmp_path / "r"))
        )
        text = (out / "talker" / "config.pbtxt").read_text()
        kv = int(re.search(r'key: "kv_cache_memory_bytes" value: \{ string_value: "(\d+)" \}', text).group(1))
        return kv, json.loads((out / "build.json").read_text())["talker_context"]

    t = cfg.talker
    per_pos = t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 2 * 4  # K and V, float32 on CPU
    kv, ctx = built(device="cpu")
    mml = ctx["max_model_len"]
    assert kv == 64 * -(-mml // 128) * 128 * per_pos == ctx["kv_cache_memory_bytes"]  # 64 seqs, whole blocks
    assert ctx["kv_cache_memory_why"].startswith(f"64 seqs x {mml} positions x {per_pos} bytes")
    assert built(device="cpu", max_num_seqs=1)[0] == CPU_KV_CACHE_FLOOR
    assert built(device="cpu", kv_cache_memory_bytes=12345678)[0] == 12345678  # an explicit value is kept
    assert built(device="gpu")[0] == 0  # GPU: gpu_memory_utilization decides
    assert built(device="cpu", engine="native")[0] == 0  # the native engine sizes its own cache

    # a real size on a small machine: at most a quarter of the memory, but always one full request
    real = Qwen3TTSConfig.from_dict(presets.main_config("0.6b-customvoice"))
    r = real.talker
    one = -(-12108 // 128) * 128 * r.num_hidden_layers * r.num_key_value_heads * r.head_dim * 2 * 4
    s = RepositorySettings(checkpoint=ckpt, device="cpu")
    size, why = vllm_cpu_kv_cache_bytes(s, real, 12108, memory=24 * 2**30)
    assert size == 6 * 2**30 > one and "capped at 6.0 GiB" in why
    assert vllm_cpu_kv_cache_bytes(s, real, 12108, memory=2**30)[0] == one


# --- the launcher --------------------------------------------------------------------------------

TRITON_LOG = """\
I1125 00:47:10.000000 100 pinned_memory_manager.cc:277] Pinned memory pool is created
I1125 00:47:11.000000 100 model_lifecycle.cc:472] loading: talker:1
I1125 00:47:11.500000 100 python_be.cc:2249] TRITONBACKEND_ModelInstanceInitialize: talker_0_0 (CPU device 0)
E1125 00:47:12.000000 100 model_lifecycle.cc:642] failed to load 'talker' version 1: Internal: ValueError: \
max_model_len 16116 is more than the checkpoint's max_position_embeddings 4096

At:
  /work/model_repository/talker/1/model.py(40): initialize

I1125 00:47:12.100000 100 model_lifecycle.cc:777] failed to load 'talker'
I1125 00:47:12.200000 100 server.cc:676]
+--------+---------+--------+
| Model  | Version | Status |
+--------+---------+--------+
| talker | 1       | UNAVAILABLE: Internal: ValueError: max_model_len 16116 ... |
+--------+---------+--------+
""" + "".join(f"I1125 00:47:13.{i:06d} 100 server.cc:100] filler line {i}\n" for i in range(80))


def test_error_lines_keep_the_cause_and_its_continuation():
    lines = launcher.error_lines(TRITON_LOG)
    text = "\n".join(lines)
    assert "failed to load 'talker' version 1" in text and "max_position_embeddings 4096" in text
    assert "model.py(40): initialize" in text  # the continuation of the error message
    assert "UNAVAILABLE: Internal" in text
    assert "filler line" not in text and "Pinned memory" not in text
    assert launcher.error_lines("I1125 00:00:00.0 1 x.cc:1] all good\n") == []
    many = "".join(f"E1125 00:00:00.{i:06d} 1 x.cc:1] failed {i}\n" for i in range(100))
    cut = launcher.error_lines(many, max_lines=10)
    assert len(cut) == 11 and cut[0].startswith("... (90 earlier") and cut[-1].endswith("failed 99")


def test_wait_ready_reports_progress_then_the_log_causes(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(TRITON_LOG)
    cmd = launcher.ServerCommand(["sleep", "30"], dict(os.environ), "wheel")
    server = launcher.TritonServer(cmd, 1, 2, 3, str(log))
    server.proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    server.is_ready = lambda: False
    seen = []
    try:
        with pytest.raises(launcher.LaunchError) as e:
            server.wait_ready(timeout=1.6, progress=seen.append, every=0.5)
    finally:
        server.proc.kill()
        server.proc.wait()
    assert len(seen) >= 2 and all(0.4 < b - a < 1.2 for a, b in zip(seen, seen[1:]))
    msg = str(e.value)
    assert msg.startswith("tritonserver not ready after 2 s; the log's error lines (")
    assert "max_position_embeddings 4096" in msg and "filler line" not in msg
    # no error line: the tail, and where the log is
    log.write_text("".join(f"I1125 00:00:00.{i:06d} 1 x.cc:1] line {i}\n" for i in range(100)))
    assert "no error line in the log; its tail" in server.log_causes() and "line 99" in server.log_causes()


def test_log_causes_are_this_starts_own(tmp_path):
    """The log is appended to: a failed start shows its own errors, not an earlier run's."""
    from system_support import free_ports

    log = tmp_path / "server.log"
    log.write_text("E1125 00:00:00.000000 1 x.cc:1] old failure of an earlier run\n")
    line = "E1125 00:00:01.000000 1 x.cc:1] new failure"
    cmd = launcher.ServerCommand(["sh", "-c", f"echo '{line}'; exit 1"], dict(os.environ), "wheel")
    server = launcher.TritonServer(cmd, *free_ports(3), str(log)).start()
    try:
        with pytest.raises(launcher.LaunchError) as e:
            server.wait_ready(timeout=30)
    finally:
        server.stop()
    assert "exited with code 1" in str(e.value) and line in str(e.value) and "old failure" not in str(e.value)


@pytest.mark.system
def test_serve_shows_the_cause_of_a_failed_start(tmp_path):
    """A model whose initialize() raises: qwen3-tts-serve exits 1 and prints Triton's error with
    the model's message, not a blind tail of the log."""
    from system_support import free_ports

    model = tmp_path / "repo" / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
        "instance_group [{ kind: KIND_CPU count: 1 }]\n"
    )
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise ValueError('the checkpoint folder /nowhere does not exist')\n"
    )
    http, grpc, metrics = free_ports(3)
    r = subprocess.run(
        [sys.executable, "-m", "triton_qwen3_tts.tools.launcher", "--model-repository", str(tmp_path / "repo")]
        + ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        + ["--log", str(tmp_path / "server.log"), "--ready-timeout", "120", "--cache-dir", str(tmp_path / "c")]
        + ["--gateway-port", "0"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"cache: {tmp_path / 'c'}" in r.stdout
    assert "error: tritonserver exited" in r.stderr and "the log's error lines" in r.stderr
    assert "the checkpoint folder /nowhere does not exist" in r.stderr
    assert "Traceback" not in r.stderr  # a message, not the launcher's own stack
