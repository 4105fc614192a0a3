import json

import pytest

from triton_qwen3_tts.serving.model_config import (
    CodecModelConfig,
    ModelConfigError,
    TalkerModelConfig,
    TtsModelConfig,
    parameters_from_model_config,
)


def pbjson(**params):
    return json.dumps({"name": "m", "parameters": {k: {"string_value": v} for k, v in params.items()}})


def test_parse_talker():
    p = parameters_from_model_config(
        pbjson(
            checkpoint="/ckpt",
            max_num_seqs="8",
            enforce_eager="true",
            kv_cache_memory_bytes="67108864",
            gpu_memory_utilization="0.3",
        )
    )
    c = TalkerModelConfig.from_parameters(p)
    assert (c.checkpoint, c.max_num_seqs, c.enforce_eager, c.kv_cache_memory_bytes, c.gpu_memory_utilization) == (
        "/ckpt",
        8,
        True,
        67108864,
        0.3,
    )
    assert c.engine == "vllm"


@pytest.mark.parametrize(
    "params,msg",
    [
        (dict(), "'checkpoint' is required"),
        (dict(checkpoint="/c", engine="tgi"), "'engine' must be one of vllm, native"),
        (dict(checkpoint="/c", max_num_seqs="many"), "max_num_seqs"),
        (dict(checkpoint="/c", max_num_seqs="0"), "max_num_seqs.: must be 1 to 1024"),
        (dict(checkpoint="/c", enforce_eager="maybe"), "true or false"),
        (dict(checkpoint="/c", bogus="1"), "unknown parameter"),
    ],
)
def test_talker_errors(params, msg):
    with pytest.raises(ModelConfigError, match=msg):
        TalkerModelConfig.from_parameters(params)


def test_codec_and_tts():
    c = CodecModelConfig.from_parameters({"checkpoint": "/c", "frame_buckets": "8, 16,32", "device": "cpu"})
    assert c.frame_buckets == (8, 16, 32)
    with pytest.raises(ModelConfigError, match="increasing"):
        CodecModelConfig.from_parameters({"checkpoint": "/c", "frame_buckets": "16,8"})
    t = TtsModelConfig.from_parameters({"checkpoint": "/c", "chunk_ramp": "2,4", "max_in_flight": "3"})
    assert t.chunk_ramp == (2, 4) and t.admission().max_in_flight == 3
    lim = t.limits("CustomVoice")
    assert lim.default_task_type == "CustomVoice"
    with pytest.raises(ModelConfigError, match="default_sample_format"):
        TtsModelConfig.from_parameters({"checkpoint": "/c", "default_sample_format": "mp3"})
    with pytest.raises(ModelConfigError, match="max_in_flight"):
        TtsModelConfig.from_parameters({"checkpoint": "/c", "max_in_flight": "0"})


def test_talker_native_knobs():
    from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig

    cfg = TalkerModelConfig.from_parameters(
        {"checkpoint": "ck", "engine": "native", "native_compile": "true", "native_batch_buckets": "1,8,32,64"}
    )
    assert cfg.native_compile is True and cfg.batch_buckets() == (1, 8, 32, 64)
    assert TalkerModelConfig(checkpoint="ck").batch_buckets() is None
    for bad in ("1,x", "0,8", "2000", ","):
        with pytest.raises(ModelConfigError, match="native_batch_buckets"):
            TalkerModelConfig.from_parameters({"checkpoint": "ck", "native_batch_buckets": bad})


def test_talker_kernels_choice():
    from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig

    base = {"checkpoint": "ck", "engine": "native"}
    assert TalkerModelConfig.from_parameters(base).native_kernels == "auto"
    # auto: the torch blocks on the CPU and for vLLM, resolved at load on a GPU
    auto = {**base, "native_kernels": "auto"}
    assert TalkerModelConfig.from_parameters({**auto, "device": "cpu"}).kernels_wanted() == "torch"
    assert TalkerModelConfig.from_parameters({**auto, "engine": "vllm"}).kernels_wanted() == "torch"
    assert TalkerModelConfig.from_parameters({**auto, "device": "cuda"}).kernels_wanted() == "auto"
    cfg = TalkerModelConfig.from_parameters({**base, "native_kernels": "triton", "device": "cuda"})
    assert cfg.native_kernels == "triton" and cfg.kernels_wanted() == "triton"
    with pytest.raises(ModelConfigError, match="native_kernels.*auto, torch, triton.*'cuda'"):
        TalkerModelConfig.from_parameters({**base, "native_kernels": "cuda"})
    with pytest.raises(ModelConfigError, match="native_kernels' triton needs engine native on a gpu"):
        TalkerModelConfig.from_parameters({**base, "native_kernels": "triton", "device": "cpu"})


def test_talker_pdl_choice():
    """native_pdl: 'few' by default (programmatic dependent launch for one-stream steps, run 37),
    any of the kernels' modes, and a bad value names the parameter and its values."""
    from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig

    base = {"checkpoint": "ck", "engine": "native"}
    assert TalkerModelConfig.from_parameters(base).native_pdl == "few"
    assert TalkerModelConfig.from_parameters({**base, "native_pdl": "off"}).native_pdl == "off"
    with pytest.raises(ModelConfigError, match="native_pdl.*off, on, prefetch, few.*'always'"):
        TalkerModelConfig.from_parameters({**base, "native_pdl": "always"})


def test_talker_split_k_range():
    """native_split_k: 1 program per multiprocessor by default (split-K of the tiled GEMMs),
    0 to 16; a value out of range names the parameter and the range."""
    from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig

    base = {"checkpoint": "ck", "engine": "native"}
    assert TalkerModelConfig.from_parameters(base).native_split_k == 1
    assert TalkerModelConfig.from_parameters({**base, "native_split_k": "0"}).native_split_k == 0
    for bad in ("17", "-1"):
        with pytest.raises(ModelConfigError, match=f"parameter 'native_split_k': must be 0 to 16; got {bad}"):
            TalkerModelConfig.from_parameters({**base, "native_split_k": bad})


@pytest.mark.parametrize(
    "name, bad, allowed",
    [
        ("native_prefill_kernel_rows", "-1", "0 to 65536"),
        ("native_deep_overlap_rows", "-2", "0 to 65536"),
        ("native_admit_hold_ms", "1001", "0 to 1000"),
        ("native_admit_hold_requests", "0", "1 to 65536"),
        ("native_admit_hold_min_rows", "0", "1 to 65536"),
        ("engine_cpu_threads", "257", "0 to 256"),
        ("fused_buffer_ms", "10", "20 to 60000"),
        ("max_num_seqs", "0", "1 to 1024"),
    ],
)
def test_talker_ranges_from_the_settings(name, bad, allowed):
    """The talker's integer settings with a range fail the load with the parameter's name and
    the setting's range (serving/settings.py, the one definition), not at first use."""
    from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig

    with pytest.raises(ModelConfigError, match=f"parameter '{name}': must be {allowed}; got {bad}"):
        TalkerModelConfig.from_parameters({"checkpoint": "ck", "engine": "native", name: bad})


def test_prompt_device_resolves_to_the_native_engines_gpu():
    """prompt_device auto projects prompts on the native engine's GPU; on the CPU, for vLLM (its
    engine has processes of its own) and with prompt_device cpu, on the CPU; a bad value names
    the parameter and its values."""
    from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig

    def dev(**kw):
        return TalkerModelConfig.from_parameters({"checkpoint": "ck", **kw}).prompt_projection_device()

    assert dev(engine="native", device="cuda") == "cuda"
    assert dev(engine="native", device="cuda:1") == "cuda:1"
    assert dev(engine="native", device="cpu") == "cpu"
    assert dev(engine="vllm", device="cuda") == "cpu"
    assert dev(engine="native", device="cuda", prompt_device="cpu") == "cpu"
    with pytest.raises(ModelConfigError, match="prompt_device.*auto, cpu.*'gpu'"):
        dev(engine="native", prompt_device="gpu")


def test_native_kernels_auto_falls_back_to_torch_where_the_kernels_cannot_run(monkeypatch):
    """auto is the Triton kernels where the GPU runs them, the torch blocks with a logged reason
    where it does not (no triton, an old GPU, a failing self-test); explicit choices pass."""
    pytest.importorskip("torch")
    from triton_qwen3_tts.engines.native import kernels as nk
    from triton_qwen3_tts.serving.model_config import TalkerModelConfig
    from triton_qwen3_tts.serving.talker.engines import native_kernels

    base = {"checkpoint": "ck", "engine": "native", "native_kernels": "auto"}
    assert native_kernels(TalkerModelConfig.from_parameters({**base, "device": "cpu"})) == "torch"
    gpu = TalkerModelConfig.from_parameters({**base, "device": "cuda"})
    monkeypatch.setattr(nk, "unavailable_reason", lambda dev: None)
    monkeypatch.setattr(nk, "self_test", lambda dev, dt: None)
    assert native_kernels(gpu) == "triton"
    monkeypatch.setattr(nk, "self_test", lambda dev, dt: "the kernels do not compile or run here")
    assert native_kernels(gpu) == "torch"
    monkeypatch.setattr(nk, "unavailable_reason", lambda dev: "compute capability 7.5 is older than 8.0")
    assert native_kernels(gpu) == "torch"
    explicit = TalkerModelConfig.from_parameters({**base, "device": "cuda", "native_kernels": "torch"})
    assert native_kernels(explicit) == "torch"
