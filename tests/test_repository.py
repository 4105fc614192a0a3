"""scripts/build_model_repository.py writes a complete, parseable repository."""

import json
import os
import re
import subprocess
import sys

import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.serving.model_config import CodecModelConfig, TalkerModelConfig, TtsModelConfig
from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(presets.main_config("tiny")))
    return str(d)


def params(pbtxt: str) -> dict:
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', pbtxt))


def test_cpu_python_repository(ckpt, tmp_path):
    out = tmp_path / "repo"
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "build_model_repository.py"),
            "--checkpoint",
            ckpt,
            "--out",
            str(out),
            "--codec-backend",
            "python",
            "--device",
            "cpu",
            "--max-num-seqs",
            "8",
            "--kv-cache-memory-bytes",
            "67108864",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for m in ("talker", "tts", "codec_decoder"):
        text = (out / m / "config.pbtxt").read_text()
        assert "${" not in text
        assert (out / m / "1" / "model.py").exists()
    talker = TalkerModelConfig.from_parameters(params((out / "talker" / "config.pbtxt").read_text()))
    assert (talker.device, talker.dtype, talker.max_num_seqs, talker.kv_cache_memory_bytes) == (
        "cpu",
        "float32",
        8,
        67108864,
    )
    codec_txt = (out / "codec_decoder" / "config.pbtxt").read_text()
    assert 'backend: "python"' in codec_txt and "KIND_CPU" in codec_txt
    codec = CodecModelConfig.from_parameters(params(codec_txt))
    assert codec.device == "cpu" and codec.cuda_graphs is False
    tts = TtsModelConfig.from_parameters(params((out / "tts" / "config.pbtxt").read_text()))
    assert tts.default_speaker == "aiden" and tts.left_context_frames == 72


def test_tensorrt_needs_a_plan_and_a_gpu(ckpt, tmp_path):
    with pytest.raises(RepositoryError, match="needs device gpu"):
        build_repository(
            RepositorySettings(checkpoint=ckpt, codec_backend="tensorrt", device="cpu"), str(tmp_path / "r")
        )
    with pytest.raises(RepositoryError, match="no TensorRT plan"):
        build_repository(
            RepositorySettings(checkpoint=ckpt, codec_backend="tensorrt", device="gpu"),
            str(tmp_path / "r"),
            templates=os.path.join(ROOT, "model_repository"),
        )
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not really a plan")
    out = build_repository(
        RepositorySettings(checkpoint=ckpt, codec_backend="tensorrt", device="gpu", plan=str(plan)), str(tmp_path / "r")
    )
    txt = open(os.path.join(out, "codec_decoder", "config.pbtxt")).read()
    assert 'platform: "tensorrt_plan"' in txt and "preferred_batch_size: [ 8, 16, 32, 64 ]" in txt
    assert os.path.exists(os.path.join(out, "codec_decoder", "1", "model.plan"))


def test_tts_instances(ckpt, tmp_path):
    out = build_repository(
        RepositorySettings(checkpoint=ckpt, codec_backend="python", device="cpu", tts_instances=3), str(tmp_path / "r")
    )
    txt = open(os.path.join(out, "tts", "config.pbtxt")).read()
    assert "instance_group [ { kind: KIND_CPU count: 3 } ]" in txt
    for bad in (0, -1, True, "2"):
        with pytest.raises(RepositoryError, match="^tts_instances: (must be 1 to 64|expected a int)"):
            build_repository(
                RepositorySettings(checkpoint=ckpt, codec_backend="python", tts_instances=bad), str(tmp_path / "r")
            )


def test_errors(ckpt, tmp_path):
    with pytest.raises(RepositoryError, match="^engine: must be one of vllm, native"):
        build_repository(RepositorySettings(checkpoint=ckpt, engine="tgi", codec_backend="python"), str(tmp_path / "r"))
    with pytest.raises(RepositoryError, match="not a checkpoint"):
        build_repository(RepositorySettings(checkpoint=str(tmp_path), codec_backend="python"), str(tmp_path / "r"))
    with pytest.raises(RepositoryError, match="not a speaker"):
        build_repository(
            RepositorySettings(checkpoint=ckpt, codec_backend="python", default_speaker="bob"), str(tmp_path / "r")
        )


def test_unfilled_placeholder_fails(ckpt, tmp_path):
    import shutil

    tpl = tmp_path / "tpl"
    shutil.copytree(os.path.join(ROOT, "model_repository"), tpl)
    p = tpl / "tts" / "config.pbtxt.in"
    p.write_text(p.read_text() + '\nparameters: { key: "x" value: { string_value: "${no_such_setting}" } }\n')
    with pytest.raises(RepositoryError, match="no_such_setting"):
        build_repository(
            RepositorySettings(checkpoint=ckpt, codec_backend="python"), str(tmp_path / "r"), templates=str(tpl)
        )
