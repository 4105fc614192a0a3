"""scripts/build_model_repository.py writes a complete, parseable repository."""

import json
import os
import re
import subprocess
import sys

import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.serving.model_config import (
    CodecModelConfig,
    ModelConfigError,
    TalkerModelConfig,
    TtsModelConfig,
    instance_count,
)
from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(presets.main_config("tiny")))
    return str(d)


def params(pbtxt: str) -> dict:
    """A config.pbtxt's string parameters, the fused tts's ``talker.``-prefixed ones included."""
    return dict(re.findall(r'key: "([\w.]+)" value: \{ string_value: "([^"]*)" \}', pbtxt))


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
    assert codec.device == "cpu" and codec.cuda_graphs is False and codec.dtype == "float32"
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


def test_the_chunk_schedule_is_checked_when_the_repository_is_built(ckpt, tmp_path):
    # A ramp entry above chunk_frames used to pass the builder and fail the tts model's load on the
    # server, after minutes of engine start on a GPU.
    def build(**kw):
        return build_repository(RepositorySettings(checkpoint=ckpt, codec_backend="python", **kw), str(tmp_path / "r"))

    with pytest.raises(RepositoryError, match=r"^'chunk_ramp' \(2,4,8,16\) has 16 outside \[1, chunk_frames=12\]"):
        build(chunk_ramp="2,4,8,16", chunk_frames=12)
    with pytest.raises(RepositoryError, match=r"^'first_chunk_frames' \(4\) and 'chunk_frames' \(3\)"):
        build(first_chunk_frames=4, chunk_ramp="2", chunk_frames=3)
    with pytest.raises(RepositoryError, match="^chunk_ramp: comma-separated frame counts"):
        build(chunk_ramp="4,eight")
    with pytest.raises(RepositoryError, match="^chunk_ramp: at least one frame count"):
        build(chunk_ramp="", chunk_frames=8)  # the models would read '' as the default 4,8,16
    with pytest.raises(RepositoryError, match=r"^'chunk_ramp' \(2,0\) has 0 outside \[1, chunk_frames=25\]$"):
        build(chunk_ramp="2,0")
    out = build(chunk_ramp="2,4,8", chunk_frames=12)
    tts = TtsModelConfig.from_parameters(params(open(os.path.join(out, "tts", "config.pbtxt")).read()))
    assert (tts.chunk_ramp, tts.chunk_frames) == ((2, 4, 8), 12)
    # the model's own check at load, for a config.pbtxt written by hand
    with pytest.raises(ModelConfigError, match=r"parameter 'chunk_ramp' \(4,8,16\) has 16 outside"):
        TtsModelConfig(checkpoint="/x", chunk_ramp=(4, 8, 16), chunk_frames=12)


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


def _models(out):
    return sorted(m for m in os.listdir(out) if os.path.isdir(os.path.join(out, m)))


def test_gpus_split_writes_one_talker_and_codec_per_gpu(tiny_checkpoint, tmp_path):
    """gpus 2, split, resident stateful codec on gpu: talker_0/1 and codec_decoder_stateful_0/1, each
    named after its directory and pinned to its GPU; the tts routes over 2 lanes."""
    out = build_repository(
        RepositorySettings(
            checkpoint=str(tiny_checkpoint),
            codec_backend="python",
            device="gpu",
            engine="native",
            codec_mode="stateful",
            gpus="2",
        ),
        str(tmp_path / "r"),
    )
    assert _models(out) == [
        "codec_decoder_stateful_0",
        "codec_decoder_stateful_1",
        "talker_0",
        "talker_1",
        "tts",
    ]
    for i in (0, 1):
        for m in ("talker", "codec_decoder_stateful"):
            txt = open(os.path.join(out, f"{m}_{i}", "config.pbtxt")).read()
            assert f'name: "{m}_{i}"' in txt
            assert os.path.exists(os.path.join(out, f"{m}_{i}", "1", "model.py"))
        # the talker shows its process only GPU i (vLLM places itself on device 0) ...
        talker_txt = open(os.path.join(out, f"talker_{i}", "config.pbtxt")).read()
        assert "instance_group [ { kind: KIND_MODEL count: 1 } ]" in talker_txt
        talker = TalkerModelConfig.from_parameters(params(talker_txt))
        assert (talker.gpu, talker.device) == (i, "cuda")
        # ... the codec, which may exchange GPU tensors with the tts, is one KIND_GPU instance there
        codec_txt = open(os.path.join(out, f"codec_decoder_stateful_{i}", "config.pbtxt")).read()
        assert f"instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ {i} ] }} ]" in codec_txt
        p = params(codec_txt)
        codec = CodecModelConfig.from_parameters({k: v for k, v in p.items() if k != "FORCE_CPU_ONLY_INPUT_TENSORS"})
        assert codec.state == "resident" and "gpu" not in p
        assert (codec.dtype, talker.codec_dtype) == ("bfloat16", "bfloat16")  # codec_dtype '' on gpu
        assert instance_count({"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [i]}]}) == 1
    tts = TtsModelConfig.from_parameters(params(open(os.path.join(out, "tts", "config.pbtxt")).read()))
    assert (tts.gpus, tts.talker_model, tts.codec_model) == ("2", "talker", "codec_decoder_stateful")
    assert json.load(open(os.path.join(out, "build.json")))["models"] == _models(out)


def test_gpus_split_tensorrt_codec_uses_instance_group_gpus(ckpt, tmp_path):
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"not really a plan")
    out = build_repository(
        RepositorySettings(checkpoint=ckpt, codec_backend="tensorrt", device="gpu", plan=str(plan), gpus="3"),
        str(tmp_path / "r"),
    )
    assert [m for m in _models(out) if m.startswith("codec")] == [
        "codec_decoder_0",
        "codec_decoder_1",
        "codec_decoder_2",
    ]
    for i in range(3):
        txt = open(os.path.join(out, f"codec_decoder_{i}", "config.pbtxt")).read()
        assert f"instance_group [ {{ kind: KIND_GPU count: 1 gpus: [ {i} ] }} ]" in txt
        assert os.path.exists(os.path.join(out, f"codec_decoder_{i}", "1", "model.plan"))


def test_gpus_on_cpu_and_fused(ckpt, tmp_path):
    """On cpu the per-GPU models share the host (no gpu parameter); fused writes one tts model
    whatever the count and leaves 'all' to the load."""
    out = build_repository(
        RepositorySettings(checkpoint=ckpt, codec_backend="python", device="cpu", gpus="2"), str(tmp_path / "r")
    )
    assert _models(out) == ["codec_decoder_0", "codec_decoder_1", "talker_0", "talker_1", "tts"]
    for m in ("talker_0", "codec_decoder_1"):
        txt = open(os.path.join(out, m, "config.pbtxt")).read()
        assert f'name: "{m}"' in txt and "gpu" not in params(txt)
    out = build_repository(
        RepositorySettings(
            checkpoint=ckpt, codec_backend="python", device="gpu", engine="native", pipeline="fused", gpus="all"
        ),
        str(tmp_path / "f"),
    )
    assert _models(out) == ["tts"]
    tts_params = params(open(os.path.join(out, "tts", "config.pbtxt")).read())
    assert tts_params["gpus"] == "all" and "talker.gpu" not in tts_params


def test_gpus_errors(ckpt, tmp_path, monkeypatch):
    from triton_qwen3_tts.serving import repository

    for bad in ("0", "two", "-1", "1.5", ""):
        with pytest.raises(RepositoryError, match=r"^gpus: must be a number of GPUs >= 1, or all"):
            build_repository(RepositorySettings(checkpoint=ckpt, codec_backend="python", gpus=bad), str(tmp_path / "r"))
    with pytest.raises(RepositoryError, match="gpus all counts CUDA GPUs, and device is cpu"):
        build_repository(
            RepositorySettings(checkpoint=ckpt, codec_backend="python", device="cpu", gpus="all"), str(tmp_path / "r")
        )
    monkeypatch.setattr(repository, "count_gpus", lambda env=None: 0)
    with pytest.raises(RepositoryError, match="no NVIDIA GPU visible here to count"):
        build_repository(
            RepositorySettings(checkpoint=ckpt, codec_backend="python", device="gpu", gpus="all"), str(tmp_path / "r")
        )
    monkeypatch.setattr(repository, "count_gpus", lambda env=None: 2)
    out = build_repository(
        RepositorySettings(checkpoint=ckpt, codec_backend="python", device="gpu", gpus="all"), str(tmp_path / "r")
    )
    assert "talker_1" in _models(out)
    txt = open(os.path.join(out, "codec_decoder_1", "config.pbtxt")).read()  # the windowed Python codec
    assert 'name: "codec_decoder_1"' in txt and "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 1 ] } ]" in txt
    assert params(open(os.path.join(out, "tts", "config.pbtxt")).read())["gpus"] == "2"


def test_count_gpus_follows_cuda_visible_devices(monkeypatch):
    from triton_qwen3_tts.serving import repository

    monkeypatch.setattr(repository.glob, "glob", lambda pattern: ["a", "b", "c", "d"])
    assert repository.count_gpus({}) == 4
    assert repository.count_gpus({"CUDA_VISIBLE_DEVICES": "1,3"}) == 2
    assert repository.count_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_vllm_cpu_kv_cache_is_shared_by_the_talkers_of_every_gpu():
    """gpus N on cpu runs N vLLM talkers: the default KV cache cap (a quarter of the memory) is
    split between them, and the build.json says so."""
    from triton_qwen3_tts.model.config import Qwen3TTSConfig
    from triton_qwen3_tts.serving.repository import vllm_cpu_kv_cache_bytes

    real = Qwen3TTSConfig.from_dict(presets.main_config("0.6b-customvoice"))
    s = RepositorySettings(checkpoint="/x", device="cpu")
    one, _ = vllm_cpu_kv_cache_bytes(s, real, 12108, memory=24 * 2**30)
    two, why = vllm_cpu_kv_cache_bytes(s, real, 12108, memory=24 * 2**30, engines=2)
    assert one == 6 * 2**30 and two == 3 * 2**30 and "shared by 2 talkers" in why


def test_codec_dtype_defaults_to_bfloat16_on_gpu_and_an_explicit_value_wins(tiny_checkpoint, tmp_path):
    """codec_dtype '' (the default) is bfloat16 on a GPU, float32 on the CPU, in the repository and
    in the typed configs a model parses; an explicit value is kept on either device."""
    for device, value, want in (("gpu", "", "bfloat16"), ("gpu", "float32", "float32"), ("cpu", "", "float32")):
        out = build_repository(
            RepositorySettings(
                checkpoint=str(tiny_checkpoint),
                codec_backend="python",
                device=device,
                engine="native",
                pipeline="fused",
                codec_dtype=value,
                max_num_seqs=4,
            ),
            str(tmp_path / f"r_{device}_{value}"),
        )
        # the fused pipeline's tts hosts the engine: the talker's parameters, prefixed
        text = open(os.path.join(out, "tts", "config.pbtxt")).read()
        assert f'key: "talker.codec_dtype" value: {{ string_value: "{want}" }}' in text, (device, value)
    assert CodecModelConfig(checkpoint="c", device="cuda").dtype == "bfloat16"
    assert CodecModelConfig(checkpoint="c", device="cpu").dtype == "float32"
    assert TalkerModelConfig(checkpoint="c", device="cuda:1").codec_dtype == "bfloat16"
    assert TalkerModelConfig(checkpoint="c", device="cpu", dtype="float32").codec_dtype == "float32"


def test_every_talker_setting_reaches_the_engine(tiny_checkpoint, tmp_path):
    """Each setting of the talker group has a placeholder in the talker's template, so a builder
    flag reaches the engine in both pipelines (the split one's talker model, the fused one's tts
    with the parameters prefixed) and the typed config parses it; here --native-pdl and
    --native-loop-thread, which the template once lacked, so that the builder took them and the
    server ran its defaults."""
    from triton_qwen3_tts.serving.settings import SETTINGS

    template = open(os.path.join(ROOT, "model_repository", "talker", "config.pbtxt.in")).read()
    missing = [st.name for st in SETTINGS if st.group == "talker" and "${%s}" % st.name not in template]
    assert missing == []
    for pipeline in ("split", "fused"):
        out = build_repository(
            RepositorySettings(
                checkpoint=str(tiny_checkpoint),
                codec_backend="python",
                device="gpu",
                engine="native",
                pipeline=pipeline,
                native_pdl="off",
                native_split_k=0,
                native_loop_thread=False,
                max_num_seqs=4,
            ),
            str(tmp_path / pipeline),
        )
        model = "talker" if pipeline == "split" else "tts"
        p = params(open(os.path.join(out, model, "config.pbtxt")).read())
        prefix = "" if pipeline == "split" else "talker."
        assert p[prefix + "native_pdl"] == "off" and p[prefix + "native_loop_thread"] == "false", pipeline
        assert p[prefix + "native_split_k"] == "0", pipeline
    cfg = TalkerModelConfig.from_parameters({"checkpoint": "c", "native_pdl": "off", "native_loop_thread": "false"})
    assert cfg.native_pdl == "off" and cfg.native_loop_thread is False
