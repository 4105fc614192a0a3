"""One settings schema (triton_qwen3_tts/serving/settings.py): the builder's settings and flags, the
models' typed-config defaults and README's table all come from it, and drift fails here."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from triton_qwen3_tts.model.config import GenerationDefaults
from triton_qwen3_tts.serving.model_config import CodecModelConfig, TalkerModelConfig, TtsModelConfig
from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings
from triton_qwen3_tts.serving.settings import BY_NAME, SETTINGS, Setting, SettingError, default
from triton_qwen3_tts.tools.build_repository import parser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import render_settings  # noqa: E402

# typed-config field -> the setting it is filled from (config.pbtxt.in passes the setting's value)
MODEL_FIELDS = {
    TalkerModelConfig: {
        "engine": "engine",
        "max_num_seqs": "max_num_seqs",
        "kv_cache_memory_bytes": "kv_cache_memory_bytes",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "enforce_eager": "enforce_eager",
        "native_compile": "native_compile",
        "native_batch_buckets": "native_batch_buckets",
        "native_kernels": "native_kernels",
        "native_overlap": "native_overlap",
        "native_loop_thread": "native_loop_thread",
        "native_deep_overlap_rows": "native_deep_overlap_rows",
        "native_admit_after_step": "native_admit_after_step",
        "native_admit_after_codec": "native_admit_after_codec",
        "native_admit_hold_ms": "native_admit_hold_ms",
        "native_admit_hold_requests": "native_admit_hold_requests",
        "native_admit_hold_min_rows": "native_admit_hold_min_rows",
        "native_prefill_kernel_rows": "native_prefill_kernel_rows",
        "prompt_device": "prompt_device",
    },
    CodecModelConfig: {
        "runtime": "codec_runtime",
        "dtype": "codec_dtype",
        "cuda_graphs": "codec_cuda_graphs",
        "max_frames": "codec_max_frames",
        "state_idle_timeout_s": "codec_state_idle_timeout_s",
    },
    TtsModelConfig: {
        name: name
        for name in (
            "codec_mode",
            "default_max_frames",
            "max_frames_limit",
            "max_text_chars",
            "max_instruct_chars",
            "first_chunk_frames",
            "chunk_frames",
            "left_context_frames",
            "max_in_flight",
            "max_queued",
            "request_deadline_s",
            "voice_cache_size",
        )
    },
}


def test_repository_settings_are_the_schema():
    fields = {f.name: f for f in dataclasses.fields(RepositorySettings)}
    assert list(fields) == [s.name for s in SETTINGS]
    for s in SETTINGS:
        if s.name != "checkpoint":
            assert fields[s.name].default == s.default, s.name


def test_builder_flags_are_the_schema():
    p = parser()
    actions = {a.dest: a for a in p._actions}
    for s in SETTINGS:
        a = actions[s.name]
        assert s.flag in a.option_strings
        assert s.help in a.help
        if s.name != "checkpoint":
            assert a.default == s.default, s.name
            assert f"allowed: {s.allowed()}" in a.help
        if s.choices:
            assert tuple(a.choices) == s.choices
    args = vars(p.parse_args(["--out", "o", "--checkpoint", "c"]))
    assert {k: v for k, v in args.items() if k not in ("out", "checkpoint")} == {
        s.name: s.default for s in SETTINGS if s.name != "checkpoint"
    }


@pytest.mark.parametrize("cls", list(MODEL_FIELDS), ids=lambda c: c.__name__)
def test_model_config_defaults_are_the_schema(cls):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for field, setting in MODEL_FIELDS[cls].items():
        assert fields[field].default == default(setting), (cls.__name__, field)
    assert TtsModelConfig.__dataclass_fields__["chunk_ramp"].default == tuple(
        int(x) for x in default("chunk_ramp").split(",")
    )


def test_readme_table_is_rendered_from_the_schema():
    text = (ROOT / "README.md").read_text()
    assert render_settings.rendered(text) == text, "README drifted: run python scripts/render_settings.py"
    drifted = text.replace("| `--max-num-seqs` | `64` |", "| `--max-num-seqs` | `32` |")
    assert drifted != text and render_settings.rendered(drifted) != drifted


def test_render_check_command():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "render_settings.py"), "--check"], capture_output=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize(
    "name,value,match",
    [
        ("device", "tpu", r"^device: must be one of auto, gpu, cpu; got 'tpu'"),
        ("max_num_seqs", 0, r"^max_num_seqs: must be 1 to 1024; got 0"),
        ("max_num_seqs", "8", r"^max_num_seqs: expected a int"),
        ("native_compile", 1, r"^native_compile: expected a bool"),
        ("request_deadline_s", 0.1, r"^request_deadline_s: must be 0.5 to 3600"),
        ("codec_state", "disk", r"^codec_state: must be one of '', resident, request"),
    ],
)
def test_a_bad_value_names_the_setting_and_what_is_allowed(tmp_path, name, value, match):
    with pytest.raises(SettingError, match=match):
        BY_NAME[name].check(value)
    (tmp_path / "config.json").write_text("{}")
    s = RepositorySettings(checkpoint=str(tmp_path), device="cpu", codec_backend="python")
    setattr(s, name, value)
    with pytest.raises(RepositoryError, match=match):
        s.validate()


def test_a_float_setting_takes_an_int():
    assert Setting("x", 1.0, "h", lo=0).check(2) == 2.0


def test_sampling_defaults_come_from_generation_config():
    gen = GenerationDefaults(temperature=0.7, top_k=30)
    limits = TtsModelConfig(checkpoint="/x").limits("CustomVoice", gen)
    assert (limits.default_temperature, limits.default_top_k) == (0.7, 30)
    # the official wrapper's defaults when the checkpoint has no generation_config.json
    limits = TtsModelConfig(checkpoint="/x").limits("CustomVoice")
    assert (limits.default_temperature, limits.default_top_k) == (
        GenerationDefaults().temperature,
        GenerationDefaults().top_k,
    )
    # a parameter of the tts model wins over the checkpoint
    cfg = TtsModelConfig.from_parameters({"checkpoint": "/x", "default_temperature": "0.5", "default_top_k": "7"})
    assert (cfg.limits("CustomVoice", gen).default_temperature, cfg.limits("CustomVoice", gen).default_top_k) == (
        0.5,
        7,
    )


def test_serving_reads_the_checkpoint_generation_config(tmp_path):
    import json

    from triton_qwen3_tts.model.checkpoint import load_generation_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20}))
    g = load_generation_defaults(tmp_path)
    assert (g.temperature, g.top_k) == (0.6, 20)


def test_readme_tts_inputs_table_quotes_the_current_defaults():
    """The `tts` inputs table names settings with their default in parentheses (`max_text_chars`
    (2000)); each must be the setting's default, and the sampling defaults the official ones."""
    from triton_qwen3_tts.serving.tts.request import TtsLimits

    text = (ROOT / "README.md").read_text()
    table = text.split("### `tts` inputs", 1)[1].split("\n\n#", 1)[0]
    quoted = re.findall(r"`(\w+)` \((\d+)\)", table)
    assert {"max_text_chars", "max_instruct_chars", "default_max_frames", "max_frames_limit"} <= {q for q, _ in quoted}
    for name, value in quoted:
        assert int(value) == default(name), (name, value)
    gen = GenerationDefaults()
    assert f"({gen.temperature} in the official ones)" in table and f"({gen.top_k} in the official ones)" in table
    assert f"| 1..{TtsLimits().max_top_k} |" in table
