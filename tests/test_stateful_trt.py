"""TensorRT path of the STATEFUL codec: profile shapes from the state layout, the scripts'
arguments, and the parity checks' logic (with onnxruntime standing in for the engine).

TensorRT is not installable here: the build/parity run itself skips naming TensorRT, and without
it both scripts must exit 3 with the usual message.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from triton_qwen3_tts.export.codec_onnx import EXIT_NO_TENSORRT, INPUT_NAME, OUTPUT_NAME, ShapeProfile, have_tensorrt
from triton_qwen3_tts.export.stateful_trt import (
    STATEFUL_TOLERANCES,
    check_io,
    compare_state,
    expected_io,
    onnx_io_shapes,
    row_positions,
    state_io,
    stateful_decoder_meta,
    stateful_profile,
)

ROOT = Path(__file__).resolve().parents[1]
EXPORT = ROOT / "export"
HAVE_TRT = have_tensorrt()
MISSING = "TensorRT (python package `tensorrt`) is not installed"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_stateful_{name}", EXPORT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def sd_meta():
    return stateful_decoder_meta(preset="tiny")


# --- the layout and the profile -----------------------------------------------------------------


def test_state_io_follows_the_decoder_layout(sd_meta):
    io = state_io(sd_meta)
    ins, outs = sd_meta.onnx_state_names()
    assert [s.input_name for s in io] == ins and [s.output_name for s in io] == outs
    shapes = sd_meta.state_shapes(5)
    for s in io:
        assert (5,) + s.row_shape == tuple(shapes[s.name])
        assert s.is_float == (s.name != "pos")
    assert [s.row_shape for s in io if s.name == "pos"] == [()]


def test_state_io_from_a_checkpoint_matches_the_preset(tiny_checkpoint, sd_meta):
    assert state_io(stateful_decoder_meta(checkpoint=str(tiny_checkpoint))) == state_io(sd_meta)
    with pytest.raises(FileNotFoundError, match="not a Qwen3-TTS checkpoint"):
        stateful_decoder_meta(checkpoint=str(tiny_checkpoint / "nope"))
    with pytest.raises(ValueError, match="unknown preset"):
        stateful_decoder_meta(preset="huge")
    with pytest.raises(ValueError, match="exactly one"):
        stateful_decoder_meta()


def test_stateful_profile_shapes(sd_meta):
    io = state_io(sd_meta)
    prof = stateful_profile(io, ShapeProfile((1, 8, 64), (1, 25, 25)))
    assert list(prof) == [INPUT_NAME] + [s.input_name for s in io]
    assert prof[INPUT_NAME] == ((1, 1, 16), (8, 25, 16), (64, 25, 16))
    for s in io:
        mn, opt, mx = prof[s.input_name]
        assert (mn, opt, mx) == tuple(sd_meta.state_shapes(b)[s.name] for b in (1, 8, 64))
    assert prof["state_in_pos"] == ((1,), (8,), (64,))


def test_check_io():
    want = {"a": (-1, -1, 16), "b": (-1, 3)}
    assert check_io({"a": (-1, -1, 16), "b": (-1, 3)}, want, "input") == []
    assert check_io({"a": ("batch", None, 16), "b": (-1, 3)}, want, "input") == []  # symbolic dims
    p = check_io({"a": (-1, -1, 16), "b": (-1, 4), "c": (1,)}, {**want, "d": (2,)}, "input")
    assert "input missing: d" in p and "input not in the state layout: c" in p
    assert "input b: shape [-1, 4], expected [-1, 3]" in p
    assert check_io({"a": (-1, -1, -1), "b": (-1, 3)}, want, "output", dynamic_ok=True) == []
    assert check_io({"a": (-1, -1, -1), "b": (-1, 3)}, want, "input") == [
        "input a: shape [-1, -1, -1], expected [-1, -1, 16]"
    ]
    assert check_io({"a": (-1, -1), "b": (-1, 3)}, want, "output", dynamic_ok=True)  # rank differs


def test_compare_state_and_positions(sd_meta):
    io = state_io(sd_meta)
    rng = np.random.default_rng(0)
    ref = {
        s.output_name: (
            rng.standard_normal((2,) + s.row_shape).astype(np.float32) * 3 if s.is_float else np.array([4, 9])
        )
        for s in io
    }
    assert compare_state(ref, dict(ref), io) == (0.0, [])
    got = dict(ref)
    k = io[0].output_name
    got[k] = ref[k] + 1e-3
    err, problems = compare_state(ref, got, io)
    assert problems == [] and 1e-3 / max(1.0, float(np.abs(ref[k]).max())) * 0.99 <= err <= 1e-3
    got[k] = ref[k].copy()
    got[k].flat[0] = np.nan
    assert "NaN/Inf" in compare_state(ref, got, io)[1][0]
    got = dict(ref, state_out_pos=np.array([4, 10]))
    assert "int state differs" in compare_state(ref, got, io)[1][0]
    pos = row_positions(8)
    assert pos[0] == 0 and len(set(pos)) == 8 and max(pos) > 71 and all(0 <= p <= 90 for p in pos)


# --- scripts: arguments (no TensorRT needed) --------------------------------------------------------


@pytest.fixture
def fake_onnx(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(b"not parsed before TensorRT is found")
    return p


@pytest.mark.parametrize("script", ["build_trt_engine", "check_parity"])
@pytest.mark.parametrize(
    "args, err",
    [
        (["--stateful"], "--stateful needs exactly one of --checkpoint DIR or --preset NAME"),
        (["--stateful", "--preset", "tiny", "--checkpoint", "/x"], "--stateful needs exactly one"),
        (["--stateful", "--preset", "huge"], "--stateful: unknown preset 'huge'"),
        (
            ["--stateful", "--checkpoint", "/nonexistent-ckpt"],
            "--stateful: /nonexistent-ckpt/speech_tokenizer/config.json",
        ),
        (["--preset", "tiny"], "only go with --stateful"),
        (["--stateful", "--preset", "tiny", "--batch-profile", "1", "8", "300"], "batch profile: MAX must be <= 256"),
    ],
)
def test_stateful_argument_errors(script, args, err, fake_onnx, capsys):
    mod = _script(script)
    extra = ["--engine", str(fake_onnx)] if script == "check_parity" else []
    with pytest.raises(SystemExit) as e:
        mod.main(["--onnx", str(fake_onnx), *extra, *args])
    assert e.value.code == 2
    assert err in capsys.readouterr().err


def test_build_stateful_defaults_and_profile(fake_onnx, tmp_path, capsys):
    mod = _script("build_trt_engine")
    a = mod.parse_args(["--stateful", "--preset", "tiny", "--onnx", str(fake_onnx)])
    assert a.out == os.path.join("build", "codec_decoder_stateful.plan")
    assert a.profile == ShapeProfile((1, 8, 64), (1, 25, 25))
    shapes = mod.profile_shapes(a)
    assert shapes == stateful_profile(state_io(stateful_decoder_meta(preset="tiny")), a.profile)
    a = mod.parse_args(["--onnx", str(fake_onnx)])  # windowed defaults unchanged
    assert a.out == os.path.join("model_repository", "codec_decoder", "1", "model.plan")
    assert a.profile == ShapeProfile((1, 8, 64), (1, 97, 97)) and a.state_io is None
    assert mod.profile_shapes(a) == {INPUT_NAME: ((1, 1, 16), (8, 97, 16), (64, 97, 16))}
    with pytest.raises(SystemExit):
        mod.parse_args(["--stateful", "--preset", "tiny", "--onnx", str(tmp_path / "none.onnx")])
    assert "export_codec_stateful_onnx.py" in capsys.readouterr().err


def test_check_parity_stateful_tolerances(fake_onnx, capsys):
    mod = _script("check_parity")
    base = ["--stateful", "--preset", "tiny", "--onnx", str(fake_onnx), "--engine", str(fake_onnx)]
    a = mod.parse_args(base)
    assert (a.atol, a.mean_atol, a.state_tol) == STATEFUL_TOLERANCES["fp16"]
    assert a.profile == ShapeProfile((1, 8, 64), (1, 25, 25)) and all(t <= 25 for _, t in a.shape_list)
    a = mod.parse_args(base + ["--fp32", "--state-tol", "0.5"])
    assert (a.atol, a.mean_atol, a.state_tol) == STATEFUL_TOLERANCES["fp32"][:2] + (0.5,)
    with pytest.raises(SystemExit):
        mod.parse_args(base + ["--state-tol", "-1"])
    assert "--state-tol must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mod.parse_args(["--onnx", str(fake_onnx), "--engine", str(fake_onnx), "--state-tol", "1"])
    assert "only go with --stateful" in capsys.readouterr().err


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed: the missing-TensorRT path cannot run")
@pytest.mark.parametrize("script", ["build_trt_engine", "check_parity"])
def test_stateful_scripts_without_tensorrt_exit_3(script, fake_onnx, tmp_path):
    extra = ["--engine", fake_onnx] if script == "check_parity" else ["--out", tmp_path / "m.plan"]
    r = _run([EXPORT / f"{script}.py", "--stateful", "--preset", "tiny", "--onnx", fake_onnx, *extra])
    assert r.returncode == EXIT_NO_TENSORRT == 3, r.stderr
    assert MISSING in r.stderr
    assert not (tmp_path / "m.plan").exists()


# --- the parity checks against a real (tiny) stateful ONNX, onnxruntime as the engine -------------


@pytest.fixture(scope="module")
def tiny_stateful_onnx_pair(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    import torch

    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights
    from triton_qwen3_tts.model.config import CodecDecoderConfig

    torch.manual_seed(0)
    cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config("tiny")["decoder_config"])
    dec = init_random_codec_weights(CodecDecoder(cfg), 0).eval()
    d = tmp_path_factory.mktemp("stateful_onnx")
    mod = _script("export_codec_stateful_onnx")
    mod.export_stateful_onnx(dec, str(d / "plain.onnx"))
    mod.export_stateful_onnx(dec, str(d / "barrier.onnx"), trt_fusion_barrier=True)
    return str(d / "barrier.onnx"), str(d / "plain.onnx")


@pytest.fixture(scope="module")
def tiny_stateful_onnx(tiny_stateful_onnx_pair):
    return tiny_stateful_onnx_pair[0]


def test_fusion_barrier_in_the_stateful_export_is_a_no_op(tiny_stateful_onnx_pair, sd_meta):
    import onnx
    import onnxruntime as ort

    from triton_qwen3_tts.export.codec_onnx import count_barrier_nodes

    barrier, plain = tiny_stateful_onnx_pair
    assert count_barrier_nodes(onnx.load(barrier)) == 6 and count_barrier_nodes(onnx.load(plain)) == 0
    io = state_io(sd_meta)
    rng = np.random.default_rng(1)
    feeds = {INPUT_NAME: rng.integers(0, 2048, size=(2, 7, 16), dtype=np.int64)}
    feeds.update(
        {
            s.input_name: (
                rng.standard_normal((2,) + s.row_shape).astype(np.float32) if s.is_float else np.array([3, 80])
            )
            for s in io
        }
    )
    outs = [ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feeds) for p in (barrier, plain)]
    assert max(float(np.abs(a - b).max()) for a, b in zip(*outs)) <= 1e-6
    assert np.abs(outs[1][0]).max() > 0  # not a trivially zero output


def test_exported_onnx_matches_the_layout(tiny_stateful_onnx, sd_meta):
    ins, outs = onnx_io_shapes(tiny_stateful_onnx)
    want_in, want_out = expected_io(state_io(sd_meta))
    assert check_io(ins, want_in, "input") == [] and check_io(outs, want_out, "output", dynamic_ok=True) == []
    assert list(ins) == list(want_in) and list(outs) == list(want_out)


def _parity_args(onnx_path, **kw):
    mod = _script("check_parity")
    a = mod.parse_args(
        [
            "--stateful",
            "--preset",
            "tiny",
            "--onnx",
            onnx_path,
            "--engine",
            onnx_path,
            "--fp32",
            "--batch-profile",
            "1",
            "2",
            "3",
            "--frames-profile",
            "1",
            "4",
            "5",
            "--codebook-size",
            "64",
        ]
    )
    for k, v in kw.items():
        setattr(a, k, v)
    return mod, a


def test_stateful_checks_pass_for_an_exact_engine_and_catch_errors(tiny_stateful_onnx, capsys):
    import onnxruntime as ort

    mod, a = _parity_args(tiny_stateful_onnx)
    sess = ort.InferenceSession(tiny_stateful_onnx, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]

    def exact(feed):
        return dict(zip(names, sess.run(names, feed)))

    a.shape_list = [(1, 1), (3, 5)]
    assert mod.stateful_checks(a, exact)
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count("carried stream call") == 6 and "rows batch=  3" in out
    a.shape_list = [(3, 4)]  # the failure cases: one shape is enough

    def audio_off(feed):
        r = exact(feed)
        r[OUTPUT_NAME] = r[OUTPUT_NAME] + 0.01  # above the fp32 atol 1e-3
        return r

    assert not mod.stateful_checks(a, audio_off)
    assert "FAIL" in capsys.readouterr().out

    def state_drifts(feed):  # a small error fed back through the state: caught on the carried stream
        r = exact(feed)
        k = "state_out_attn_0_k"
        r[k] = r[k] * 1.01
        return r

    assert not mod.stateful_checks(a, state_drifts)

    def nan_state(feed):
        r = exact(feed)
        r["state_out_decoder_6_conv"] = np.full_like(r["state_out_decoder_6_conv"], np.nan)
        return r

    assert not mod.stateful_checks(a, nan_state)
    assert "NaN/Inf" in capsys.readouterr().out

    def rows_mixed(feed):  # rows not independent: every row gets row 0's audio
        r = exact(feed)
        r[OUTPUT_NAME] = np.repeat(r[OUTPUT_NAME][:1], r[OUTPUT_NAME].shape[0], axis=0)
        return r

    assert not mod.stateful_checks(a, rows_mixed)


@pytest.mark.skipif(not HAVE_TRT, reason="TensorRT not installed (python package `tensorrt`)")
def test_trt_stateful_build_and_parity_on_tiny_export(tiny_stateful_onnx, tmp_path):
    """Build an fp32 engine of the tiny stateful export and compare with onnxruntime (GPU + TensorRT)."""
    plan = tmp_path / "stateful.plan"
    prof = ["--batch-profile", "1", "2", "4", "--frames-profile", "1", "4", "8"]
    r = _run(
        [
            EXPORT / "build_trt_engine.py",
            "--stateful",
            "--preset",
            "tiny",
            "--onnx",
            tiny_stateful_onnx,
            "--out",
            plan,
            "--fp32",
            "--timing-cache",
            tmp_path / "cache",
            *prof,
        ],
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run(
        [
            EXPORT / "check_parity.py",
            "--stateful",
            "--preset",
            "tiny",
            "--onnx",
            tiny_stateful_onnx,
            "--engine",
            plan,
            "--fp32",
            "--codebook-size",
            "64",
            *prof,
        ],
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity PASSED" in r.stdout


# --- the TensorRT stateful codec in the model repository ----------------------------------------


def _io_entries(text):
    """name -> the entry's text, for every `{ name: ... }` I/O entry of a config.pbtxt."""
    import re

    return {m.group(1): m.group(0) for m in re.finditer(r'\{\s*name: "(\w+)"[^\n]*', text)}


def test_repository_tensorrt_stateful_codec(tiny_checkpoint, tmp_path):
    import re

    from triton_qwen3_tts.serving.model_config import TtsModelConfig
    from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository
    from triton_qwen3_tts.serving.codec.stateful import state_specs_from_checkpoint

    plan = tmp_path / "stateful.plan"
    plan.write_bytes(b"not really a plan")
    common = dict(checkpoint=str(tiny_checkpoint), codec_backend="python", codec_mode="stateful")
    out = build_repository(
        RepositorySettings(
            device="gpu", codec_stateful_backend="tensorrt", stateful_plan=str(plan), codec_dtype="bfloat16", **common
        ),
        str(tmp_path / "trt"),
    )
    text = open(os.path.join(out, "codec_decoder_stateful", "config.pbtxt")).read()
    assert "${" not in text and 'platform: "tensorrt_plan"' in text and "backend:" not in text
    assert re.search(r"max_batch_size: 64\b", text) and "dynamic_batching {" in text and "KIND_GPU" in text
    assert "optional: true" not in text and 'name: "start"' not in text
    assert open(os.path.join(out, "codec_decoder_stateful", "1", "model.plan"), "rb").read() == plan.read_bytes()
    assert not os.path.exists(os.path.join(out, "codec_decoder_stateful", "1", "model.py"))
    # the same I/O names as the Python stateful model (minus `start`), float32 state (engine I/O)
    py = build_repository(RepositorySettings(device="gpu", codec_state="request", **common), str(tmp_path / "py"))
    py_text = open(os.path.join(py, "codec_decoder_stateful", "config.pbtxt")).read()
    trt_io, py_io = _io_entries(text), _io_entries(py_text)
    assert set(trt_io) == set(py_io) - {"start"}
    specs = state_specs_from_checkpoint(str(tiny_checkpoint))
    assert len(trt_io) == 2 + 2 * len(specs)
    for s in specs:
        for name in (s.input_name, s.output_name):
            e = trt_io[name]
            assert ("TYPE_FP32" if s.is_float else "TYPE_INT64") in e
            assert f"dims: [ {', '.join(map(str, s.dims))} ]" in e
            assert ("reshape: { shape: [ ] }" in e) == (s.name == "pos")
    tts = open(os.path.join(out, "tts", "config.pbtxt")).read()
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', tts))
    cfg = TtsModelConfig.from_parameters(params)
    assert cfg.codec_zero_state_start is True and cfg.codec_model == "codec_decoder_stateful"
    py_tts = dict(
        re.findall(
            r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', open(os.path.join(py, "tts", "config.pbtxt")).read()
        )
    )
    assert TtsModelConfig.from_parameters(py_tts).codec_zero_state_start is False

    for kw, msg in [
        (dict(device="cpu", codec_stateful_backend="tensorrt", stateful_plan=str(plan)), "needs device gpu"),
        (dict(device="gpu", codec_stateful_backend="tensorrt"), "needs --stateful-plan"),
        (dict(device="gpu", codec_stateful_backend="tensorrt", stateful_plan=str(tmp_path / "none")), "no such file"),
        (dict(device="gpu", codec_stateful_backend="onnx"), "codec_stateful_backend: must be one of python, tensorrt"),
    ]:
        with pytest.raises(RepositoryError, match=msg):
            build_repository(RepositorySettings(**common, **kw), str(tmp_path / "bad"))
    with pytest.raises(RepositoryError, match="needs codec_mode stateful"):
        build_repository(
            RepositorySettings(
                checkpoint=str(tiny_checkpoint),
                codec_backend="python",
                device="gpu",
                codec_stateful_backend="tensorrt",
                stateful_plan=str(plan),
            ),
            str(tmp_path / "bad"),
        )


def test_zero_state_inputs(sd_meta):
    from triton_qwen3_tts.serving.codec.stateful import state_specs, zero_state_inputs

    specs = state_specs(sd_meta)
    z = zero_state_inputs(specs)
    assert [n for n, _ in z] == [s.input_name for s in specs]
    for (n, a), s in zip(z, specs):
        assert a.shape == (1,) + s.dims and not a.any()
        assert a.dtype == (np.float32 if s.is_float else np.int64)
    # the Python stateful model takes the same zero state as a first chunk (start not sent)
    from triton_qwen3_tts.serving.codec.stateful import parse_request

    req = parse_request(np.zeros((1, 2, 16), np.int64), None, dict(z), specs)
    assert req.state is not None and req.state["pos"].shape == (1,)
    assert all(not bool(v.any()) for v in req.state.values())
