"""Checkpoint writing (random_checkpoint.py) and loading/validation (checkpoint.py).

The first group tests the machinery alone (safetensors writer, value rules, header comparison).
The second uses the reference modules of other files and skips, naming the file, while one of
them does not exist yet.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.tools import random_checkpoint as rc
from triton_qwen3_tts.model.checkpoint import (
    CheckpointError,
    REQUIRED_FILES,
    compare_header,
    load_checkpoint,
    load_codec_decoder,
    load_talker_config,
    read_safetensors_header,
    validate_checkpoint,
)
from triton_qwen3_tts.model.config import ConfigError, Qwen3TTSConfig, SpeechTokenizerConfig
from triton_qwen3_tts.model.tensor_specs import TensorSpec

PACKAGE = Path(rc.__file__).parents[1]


# ----------------------------------------------------------------------------------------------
# Machinery, no model modules needed.

SPECS = [
    TensorSpec("b.weight", (3, 5), torch.bfloat16),
    TensorSpec("a.norm.weight", (7,), torch.float32),
    TensorSpec("c.idx", (2, 2), torch.int64),
    TensorSpec("c.flag", (1,), torch.bool),
    TensorSpec("d.scalar", (), torch.float32),
]


def _values(spec):
    n = spec.numel
    if spec.dtype == torch.bool:
        yield torch.ones(n, dtype=torch.bool)
    elif spec.dtype.is_floating_point:
        yield (torch.arange(n, dtype=torch.float32) / 3 - 1).to(spec.dtype)
    else:
        yield torch.arange(n, dtype=spec.dtype)


def test_safetensors_writer_is_read_back_exactly(tmp_path):
    path = tmp_path / "x.safetensors"
    rc.write_safetensors(path, SPECS, _values)
    got = load_file(path)
    assert set(got) == {s.key for s in SPECS}
    for s in SPECS:
        want = torch.cat(list(_values(s))).reshape(s.shape)
        assert got[s.key].dtype == s.dtype and got[s.key].shape == torch.Size(s.shape)
        assert torch.equal(got[s.key], want), s.key
    header = read_safetensors_header(path)
    assert header["b.weight"] == ((3, 5), "BF16") and header["d.scalar"] == ((), "F32")
    assert not (tmp_path / "x.safetensors.tmp").exists()


def test_safetensors_writer_bytes_do_not_depend_on_spec_order(tmp_path):
    rc.write_safetensors(tmp_path / "a.safetensors", SPECS, _values)
    rc.write_safetensors(tmp_path / "b.safetensors", list(reversed(SPECS)), _values)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_safetensors_writer_rejects_wrong_value_size(tmp_path):
    with pytest.raises(ValueError, match=r"key 'b.weight': wrote 20 bytes, expected 30"):
        rc.write_safetensors(
            tmp_path / "x.safetensors", SPECS[:1], lambda s: iter([torch.zeros(10, dtype=torch.bfloat16)])
        )


@pytest.mark.parametrize(
    "key,value",
    [
        ("decoder.quantizer.rvq_first.vq.layers.0._codebook.cluster_usage", 1.0),
        ("encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.initialized", 1.0),
        ("decoder.pre_transformer.layers.0.self_attn_layer_scale.scale", 0.01),
        ("decoder.upsample.0.1.gamma", 1e-6),
        ("decoder.decoder.5.alpha", 0.0),
        ("decoder.decoder.1.block.0.beta", 0.0),
        ("talker.model.layers.0.self_attn.q_norm.weight", 1.0),
        ("talker.model.layers.3.post_attention_layernorm.weight", 1.0),
        ("talker.model.norm.weight", 1.0),
        ("decoder.upsample.0.1.norm.bias", 0.0),
        ("talker.text_projection.linear_fc1.bias", 0.0),
    ],
)
def test_fast_rule_constants(key, value):
    t = torch.cat(list(rc.rule_init_value(key, (4, 3), torch.float32, seed=0)))
    assert torch.equal(t, torch.full((12,), value, dtype=torch.float32))


def test_fast_rule_random_weights(monkeypatch):
    monkeypatch.setattr(rc, "_CHUNK_ELEMENTS", 1000)  # several chunks
    key = "talker.model.layers.0.mlp.up_proj.weight"
    a = torch.cat(list(rc.rule_init_value(key, (50, 80), torch.float32, seed=0)))
    assert a.shape == (4000,) and abs(a.std().item() - 0.02) < 0.002 and abs(a.mean().item()) < 0.002
    again = torch.cat(list(rc.rule_init_value(key, (50, 80), torch.float32, seed=0)))
    assert torch.equal(a, again)
    other_seed = torch.cat(list(rc.rule_init_value(key, (50, 80), torch.float32, seed=1)))
    other_key = torch.cat(list(rc.rule_init_value(key + "x", (50, 80), torch.float32, seed=0)))
    assert not torch.equal(a, other_seed) and not torch.equal(a, other_key)
    bf = torch.cat(list(rc.rule_init_value(key, (50, 80), torch.bfloat16, seed=0)))
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, a.to(torch.bfloat16))
    codebook = torch.cat(list(rc.rule_init_value("x._codebook.embedding_sum", (100, 40), torch.float32, seed=0)))
    assert 0.9 < codebook.std().item() < 1.1


def test_compare_header_names_every_problem():
    specs = [
        TensorSpec("a.weight", (4, 8), torch.bfloat16),
        TensorSpec("b.weight", (8,), torch.bfloat16),
        TensorSpec("c.buf", (2,), torch.float32),
        TensorSpec("encoder.x", (1,), torch.float32),
    ]
    header = {
        "a.weight": ((4, 6), "BF16"),
        "c.buf": ((2,), "I64"),
        "z.extra": ((3, 3), "F32"),
        "encoder.x": ((1,), "F32"),
        "encoder.y": ((5,), "F32"),
    }
    problems = compare_header(header, specs, ignore_prefixes=("encoder.y",))
    assert problems == [
        "key 'a.weight': expected shape [4, 8], found [4, 6]",
        "missing key 'b.weight' (expected shape [8])",
        "key 'c.buf': expected a float tensor (torch.float32), found dtype I64",
        "unexpected key 'z.extra' (shape [3, 3])",
    ]
    # A float file of another precision is fine (dtype class only).
    assert compare_header({"a.weight": ((4, 8), "F32")}, specs[:1]) == []


def test_read_header_rejects_non_safetensors(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"hello world, this is not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: not a safetensors file"):
        read_safetensors_header(bad)
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.zeros(100)}, good)
    good.write_bytes(good.read_bytes()[:-8])
    with pytest.raises(CheckpointError, match="good.safetensors: truncated"):
        read_safetensors_header(good)


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        validate_checkpoint(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps(presets.main_config("tiny")))
    with pytest.raises(CheckpointError) as e:
        validate_checkpoint(tmp_path)
    msg = str(e.value)
    assert (
        "missing file(s) model.safetensors, vocab.json, merges.txt, tokenizer_config.json, "
        "speech_tokenizer/config.json" in msg
    )
    assert "generation_config.json" in msg.split("optional:")[1]  # listed as optional only
    assert isinstance(e.value, ConfigError)


# ----------------------------------------------------------------------------------------------
# Layout of the real presets (meta device) against the released checkpoints' parameter counts.

SPEC_6_1 = {  # preset: (tensors, params) of model.safetensors
    "0.6b-base": (478, 914_643_008),
    "0.6b-customvoice": (402, 905_788_672),
    "1.7b-base": (480, 1_928_677_440),
    "1.7b-customvoice": (404, 1_916_676_352),
    "1.7b-voicedesign": (404, 1_916_676_352),
}


@pytest.mark.parametrize("preset", sorted(SPEC_6_1))
def test_real_preset_main_layout_matches_spec(preset):
    config = Qwen3TTSConfig.from_dict(presets.main_config(preset))
    specs = rc.main_tensor_specs(config)
    assert rc.count_params(specs) == SPEC_6_1[preset]
    assert {s.dtype for s in specs} == {torch.bfloat16}
    assert sum(s.nbytes for s in specs) == 2 * SPEC_6_1[preset][1]
    keys = {s.key for s in specs}
    assert ("talker.code_predictor.small_to_mtp_projection.weight" in keys) == preset.startswith("1.7b")
    assert any(k.startswith("speaker_encoder.") for k in keys) == preset.endswith("base")
    assert not any("inv_freq" in k for k in keys)


def test_speech_tokenizer_layout_matches_spec():
    st = SpeechTokenizerConfig.from_dict(presets.speech_tokenizer_config("1.7b-base"))
    dec = rc.speech_tokenizer_tensor_specs(st, encoder=False)
    enc = rc.speech_tokenizer_tensor_specs(st, decoder=False)
    assert rc.count_params(dec)[1] == 114_323_137
    assert rc.count_params(enc)[1] == 56_234_304
    both = rc.speech_tokenizer_tensor_specs(st)
    assert rc.count_params(both) == (496, 170_557_441)
    assert {s.dtype for s in both} == {torch.float32}
    assert sum(s.nbytes for s in both) == 682_229_764
    assert all(s.key.startswith(("decoder.", "encoder.")) for s in both)


# ----------------------------------------------------------------------------------------------
# Tiny checkpoints: write, load, errors.


def _state_from_file(path: Path) -> dict:
    return load_file(path)


@pytest.mark.parametrize("fixture", ["tiny_checkpoint", "tiny_base_checkpoint", "tiny_voicedesign_checkpoint"])
def test_tiny_round_trip(fixture, request):
    ckpt_dir = request.getfixturevalue(fixture)
    for f in REQUIRED_FILES + ("generation_config.json", "preprocessor_config.json"):
        assert (ckpt_dir / f).is_file(), f
    assert json.loads((ckpt_dir / "preprocessor_config.json").read_text()) == {
        "processor_class": "Qwen3TTSProcessor",
        "padding_side": "left",
    }
    assert len((ckpt_dir / "generation_config.json").read_bytes()) == 245

    ck = load_checkpoint(ckpt_dir, dtype=torch.float32, load_encoder=True)
    preset = {
        "tiny_checkpoint": "tiny",
        "tiny_base_checkpoint": "tiny-base",
        "tiny_voicedesign_checkpoint": "tiny-voicedesign",
    }[fixture]
    assert ck.config == Qwen3TTSConfig.from_dict(presets.main_config(preset))
    assert ck.generation.max_new_tokens == 8192
    assert (ck.speaker_encoder is not None) == (preset == "tiny-base")
    assert ck.tokenizer is not None

    main = _state_from_file(ckpt_dir / "model.safetensors")
    assert {v.dtype for v in main.values()} == {torch.bfloat16}
    state = ck.model.state_dict()
    assert set(state) == set(main)
    for k, v in state.items():
        assert v.dtype == torch.float32 and torch.equal(v, main[k].float()), k
    st = _state_from_file(ckpt_dir / "speech_tokenizer" / "model.safetensors")
    assert {v.dtype for v in st.values()} == {torch.float32}
    for prefix, module in (("decoder.", ck.decoder), ("encoder.", ck.encoder)):
        sub = module.state_dict()
        assert {prefix + k for k in sub} == {k for k in st if k.startswith(prefix)}
        for k, v in sub.items():
            assert torch.equal(v, st[prefix + k]), prefix + k
    usage = [v for k, v in st.items() if k.endswith("cluster_usage")]
    assert usage and all(bool((u > 0).all()) for u in usage)
    for m in (ck.model, ck.decoder, ck.encoder):
        assert not m.training
        assert all(t.device.type == "cpu" for t in list(m.parameters()) + list(m.buffers()))
    # The talker is not degenerate: weights are random, norms are one.
    w = ck.model.talker.codec_head.weight
    assert 0.005 < w.std().item() < 0.1
    assert torch.equal(ck.model.talker.model.norm.weight, torch.ones_like(ck.model.talker.model.norm.weight))


def test_default_dtype_is_bf16_and_decoder_fp32(tiny_checkpoint):
    ck = load_checkpoint(tiny_checkpoint, load_tokenizer=False)
    assert {p.dtype for p in ck.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in ck.decoder.parameters()} == {torch.float32}
    assert ck.encoder is None and ck.tokenizer is None
    dec = load_codec_decoder(tiny_checkpoint)
    for (k, a), (k2, b) in zip(ck.decoder.state_dict().items(), dec.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    assert load_talker_config(tiny_checkpoint) == ck.config
    main_only = load_checkpoint(tiny_checkpoint, load_speech_tokenizer=False, load_tokenizer=False)
    assert main_only.decoder is None and main_only.speech_tokenizer_config is None


def test_cli_writes_identical_files_and_seed_changes_weights(tiny_checkpoint, tmp_path):
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("make_random_checkpoint", PACKAGE.parent / "scripts" / "make_random_checkpoint.py")
    cli = module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--preset", "tiny", "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    for f in tiny_checkpoint.rglob("*"):
        if f.is_file() and f.name != ".complete":
            assert filecmp.cmp(f, tmp_path / "a" / f.relative_to(tiny_checkpoint), shallow=False), f
    with pytest.raises(FileExistsError):
        cli.main(["--preset", "tiny", "--out", str(tmp_path / "a"), "--no-progress"])
    rc.write_random_checkpoint("tiny", tmp_path / "b", seed=1)
    a = load_file(tmp_path / "a" / "model.safetensors")
    b = load_file(tmp_path / "b" / "model.safetensors")
    k = "talker.codec_head.weight"
    assert a.keys() == b.keys() and not torch.equal(a[k], b[k])


def test_fast_method_tiny_loads(tmp_path):
    out = rc.write_random_checkpoint("tiny-base", tmp_path / "fast", seed=3, method="fast")
    ck = load_checkpoint(out, dtype=torch.float32, load_encoder=True)
    usage = [v for k, v in ck.decoder.state_dict().items() if k.endswith("cluster_usage")]
    assert usage and all(torch.equal(u, torch.ones_like(u)) for u in usage)
    assert torch.equal(ck.model.talker.model.norm.weight, torch.ones_like(ck.model.talker.model.norm.weight))


def _variant(src: Path, dst: Path, drop=(), replace=None) -> Path:
    """A checkpoint dir of symlinks to ``src`` files, minus ``drop``, with ``replace`` written."""
    replace = replace or {}
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if not f.is_file() or str(rel) in drop or str(rel) in replace:
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(f, dst / rel)
    for rel, write in replace.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        write(dst / rel)
    return dst


def _edit_safetensors(src: Path, edit):
    def write(path):
        state = load_file(src)
        edit(state)
        save_file(state, path)

    return write


def test_error_missing_file(tiny_checkpoint, tmp_path):
    d = _variant(tiny_checkpoint, tmp_path / "v", drop={"speech_tokenizer/model.safetensors"})
    with pytest.raises(
        CheckpointError,
        match=r"missing file\(s\) speech_tokenizer/model.safetensors\. "
        r"Required: config.json",
    ):
        load_checkpoint(d)
    # Without the speech tokenizer it is not needed.
    assert load_checkpoint(d, load_speech_tokenizer=False, load_tokenizer=False).decoder is None


def test_missing_generation_config_falls_back_with_warning(tiny_checkpoint, tmp_path, caplog):
    d = _variant(tiny_checkpoint, tmp_path / "v", drop={"generation_config.json"})
    with caplog.at_level(logging.WARNING, logger="triton_qwen3_tts.model.checkpoint"):
        ck = load_checkpoint(d, load_speech_tokenizer=False, load_tokenizer=False)
    assert ck.generation.max_new_tokens == 2048
    assert "generation_config.json is missing" in caplog.text


def test_error_missing_key(tiny_checkpoint, tmp_path):
    key = "talker.code_predictor.lm_head.3.weight"
    src = tiny_checkpoint / "model.safetensors"
    d = _variant(
        tiny_checkpoint, tmp_path / "v", replace={"model.safetensors": _edit_safetensors(src, lambda s: s.pop(key))}
    )
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    msg = str(e.value)
    assert str(d / "model.safetensors") in msg and f"missing key '{key}' (expected shape [" in msg


def test_error_wrong_shape_and_unexpected_key(tiny_checkpoint, tmp_path):
    key = "talker.codec_head.weight"
    src = tiny_checkpoint / "model.safetensors"

    def edit(state):
        state[key] = state[key][:, :-1].contiguous()
        state["talker.extra.weight"] = torch.zeros(2, 2, dtype=torch.bfloat16)

    d = _variant(tiny_checkpoint, tmp_path / "v", replace={"model.safetensors": _edit_safetensors(src, edit)})
    hidden = presets.main_config("tiny")["talker_config"]["hidden_size"]
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    msg = str(e.value)
    assert msg.startswith(f"{d / 'model.safetensors'}: 2 problem(s)")
    assert f"key '{key}': expected shape [3072, {hidden}], found [3072, {hidden - 1}]" in msg
    assert "unexpected key 'talker.extra.weight' (shape [2, 2])" in msg


def test_error_wrong_shape_in_speech_tokenizer(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint / "speech_tokenizer" / "model.safetensors"
    with safe_open(str(src), "pt") as f:
        key = sorted(k for k in f.keys() if k.startswith("decoder.") and k.endswith("embedding_sum"))[0]
        shape = list(f.get_slice(key).get_shape())

    def edit(state):
        state[key] = torch.ones(shape[0] + 1, *shape[1:])

    d = _variant(
        tiny_checkpoint, tmp_path / "v", replace={"speech_tokenizer/model.safetensors": _edit_safetensors(src, edit)}
    )
    bad_shape = ", ".join(str(s) for s in [shape[0] + 1] + shape[1:])
    with pytest.raises(
        CheckpointError,
        match=rf"(?s)speech_tokenizer/model.safetensors: 1 problem.*"
        rf"key '{key}': expected shape \[.*found \[{bad_shape}\]",
    ):
        load_checkpoint(d, load_tokenizer=False)


def test_encoder_keys_checked_only_when_loaded(tiny_checkpoint, tmp_path):
    src = tiny_checkpoint / "speech_tokenizer" / "model.safetensors"

    def edit(state):
        for k in [k for k in state if k.startswith("encoder.")]:
            del state[k]

    d = _variant(
        tiny_checkpoint, tmp_path / "v", replace={"speech_tokenizer/model.safetensors": _edit_safetensors(src, edit)}
    )
    assert load_checkpoint(d, load_tokenizer=False).encoder is None
    with pytest.raises(CheckpointError, match=r"missing key 'encoder\."):
        load_checkpoint(d, load_tokenizer=False, load_encoder=True)


def test_error_unknown_tts_model_type(tiny_checkpoint, tmp_path):
    def write(path):
        cfg = presets.main_config("tiny")
        cfg["tts_model_type"] = "voice_clone"
        path.write_text(json.dumps(cfg))

    d = _variant(tiny_checkpoint, tmp_path / "v", replace={"config.json": write})
    with pytest.raises(
        ConfigError,
        match=r"config.json: tts_model_type 'voice_clone'; expected one of "
        r"\['base', 'custom_voice', 'voice_design'\]",
    ):
        load_checkpoint(d)


def test_error_config_of_another_model_type(tiny_checkpoint, tmp_path):
    """A CustomVoice file under a Base config: the speaker encoder tensors are missing."""
    d = _variant(
        tiny_checkpoint,
        tmp_path / "v",
        replace={"config.json": lambda p: p.write_text(json.dumps(presets.main_config("tiny-base")))},
    )
    with pytest.raises(CheckpointError, match=r"tts_model_type='base'.*\n  - missing key 'speaker_encoder\."):
        load_checkpoint(d)


# ----------------------------------------------------------------------------------------------
# Real size, streamed (slow: writes 1.8 GB + 682 MB).


@pytest.mark.slow
def test_real_size_write_validates(tmp_path):
    out = rc.write_random_checkpoint("0.6b-customvoice", tmp_path / "real", seed=0)
    assert (out / "model.safetensors").stat().st_size > 1_811_577_344
    config, st = validate_checkpoint(out, load_encoder=True)
    assert config.tts_model_size == "0b6"
    header = read_safetensors_header(out / "model.safetensors")
    assert len(header) == SPEC_6_1["0.6b-customvoice"][0]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        w = f.get_tensor("talker.codec_head.weight").float()
    assert 0.015 < w.std().item() < 0.025
