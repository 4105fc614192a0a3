"""Codec ONNX export, TRT fusion barrier, parity, and the TensorRT scripts' argument handling.

Fast tests use the tiny decoder (preset "tiny"); the real-size (114M params) export + parity is
marked slow. TensorRT is not installable here: tests that need it skip naming TensorRT.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from triton_qwen3_tts.export import codec_onnx as ox
from triton_qwen3_tts.export.codec_onnx import (
    EXIT_NO_TENSORRT,
    INPUT_NAME,
    OUTPUT_NAME,
    ShapeProfile,
    have_tensorrt,
)

ROOT = Path(__file__).resolve().parents[1]
EXPORT = ROOT / "export"
HAVE_TRT = have_tensorrt()
needs_trt = pytest.mark.skipif(not HAVE_TRT, reason="TensorRT not installed (python package `tensorrt`)")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_export_{name}", EXPORT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(args, timeout=600, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


# --- tiny decoder built in-process (no checkpoint needed) -------------------------------------


@pytest.fixture(scope="module")
def tiny_decoder():
    codec = importlib.import_module("triton_qwen3_tts.model.codec")
    import torch

    from triton_qwen3_tts.model.config import SpeechTokenizerConfig
    from triton_qwen3_tts.model.presets import speech_tokenizer_config

    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = SpeechTokenizerConfig.from_dict(speech_tokenizer_config("tiny")).decoder
    dec = codec.CodecDecoder(cfg).eval()
    codec.init_random_codec_weights(dec, seed=0)
    return dec


@pytest.fixture(scope="module")
def tiny_onnx(tiny_decoder, tmp_path_factory):
    """(plain export, export with barrier) of the tiny decoder."""
    d = tmp_path_factory.mktemp("onnx")
    plain = str(d / "plain.onnx")
    ox.export_codec_onnx(tiny_decoder, plain, trt_fusion_barrier=False)
    barrier = str(d / "barrier.onnx")
    ox.apply_trt_fusion_barrier_file(plain, barrier)
    return plain, barrier


def test_onnx_io_contract(tiny_onnx):
    import onnx

    m = onnx.load(tiny_onnx[1])
    assert max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) >= 18
    (inp,), (out,) = m.graph.input, m.graph.output
    assert inp.name == INPUT_NAME and out.name == OUTPUT_NAME
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == ["batch", "frames", 16]
    # fp32 weights only
    assert all(
        i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL)
        for i in m.graph.initializer
    )


def test_dynamic_axes_run_at_untraced_shapes(tiny_onnx):
    sess = ox.ort_session(tiny_onnx[1])
    for b, t in ((1, 1), (3, 5), (2, 80)):  # 80 > the 72-frame sliding window
        y = sess.run([OUTPUT_NAME], {INPUT_NAME: ox.random_codes(b, t)})[0]
        assert y.shape == (b, t * 1920) and y.dtype == np.float32
        assert np.isfinite(y).all() and np.abs(y).max() <= 1.0


def test_barrier_placed_around_the_post_transformer_transpose(tiny_onnx):
    import onnx

    m = onnx.load(tiny_onnx[1])
    assert ox.count_barrier_nodes(onnx.load(tiny_onnx[0])) == 0
    assert ox.count_barrier_nodes(m) == 6  # (Slice, Sub, Add) before and after
    nodes = {n.name: n for n in m.graph.node}
    pre_add, post_add = nodes[f"{ox.BARRIER_PREFIX}/pre/Add"], nodes[f"{ox.BARRIER_PREFIX}/post/Add"]
    (tr,) = [n for n in m.graph.node if n.op_type == "Transpose" and pre_add.output[0] in n.input]
    assert post_add.input[0] == tr.output[0]
    # zero = Sub(c, c) of a runtime slice (not a constant), so no constant folder removes it.
    for tag in ("pre", "post"):
        sub = nodes[f"{ox.BARRIER_PREFIX}/{tag}/Sub"]
        assert sub.input[0] == sub.input[1] == nodes[f"{ox.BARRIER_PREFIX}/{tag}/Slice"].output[0]
    # Only the barrier reads the Transpose output; everything downstream reads the barrier.
    readers = [n for n in m.graph.node if tr.output[0] in n.input]
    assert {n.name for n in readers} == {f"{ox.BARRIER_PREFIX}/post/Slice", f"{ox.BARRIER_PREFIX}/post/Add"}
    # It is the transpose after the pre-transformer: a ConvTranspose (upsample) is downstream
    # within a few nodes, and pre_transformer's output projection is upstream.
    cons = ox._consumers(m.graph)
    frontier, seen_convt = [post_add.output[0]], False
    for _ in range(4):
        nxt = []
        for t in frontier:
            for c in cons.get(t, []):
                seen_convt |= c.op_type == "ConvTranspose"
                nxt.extend(c.output)
        frontier = nxt
    assert seen_convt
    assert ox.find_post_transformer_transpose(onnx.load(tiny_onnx[0])).name == tr.name


def test_barrier_is_a_numerical_no_op(tiny_onnx):
    d = ox.compare_onnx_models(*tiny_onnx, shapes=[(1, 3), (3, 17), (2, 75)])
    assert d <= 1e-6


def test_barrier_refuses_twice_and_missing_site(tiny_onnx):
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(tiny_onnx[1])
    with pytest.raises(ox.ExportError, match="already has"):
        ox.insert_trt_fusion_barrier(m)
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(ox.ExportError, match="could not find the Transpose after pre_transformer.output_proj"):
        ox.insert_trt_fusion_barrier(helper.make_model(g))


def test_parity_and_row_independence(tiny_decoder, tiny_onnx):
    rep = ox.check_parity(
        tiny_decoder, tiny_onnx[1], shapes=[(1, 1), (3, 9), (2, 80)], atol=1e-4, samples_per_frame=1920
    )
    assert rep.ok, rep.summary()
    kinds = [(c.kind, c.batch, c.frames) for c in rep.cases]
    assert kinds == [("batch", 1, 1), ("batch", 3, 9), ("row", 3, 9), ("batch", 2, 80), ("row", 2, 80)]
    assert "parity OK" in rep.summary()


def test_parity_detects_a_wrong_model(tiny_decoder, tiny_onnx):
    import copy

    import torch

    other = copy.deepcopy(tiny_decoder)
    with torch.no_grad():
        p = next(p for n, p in other.named_parameters() if "pre_transformer" in n and p.dim() == 2)
        p.add_(0.5)
    rep = ox.check_parity(other, tiny_onnx[1], shapes=[(1, 4)], atol=1e-4)
    assert not rep.ok and rep.max_abs > 1e-4
    assert "parity FAILED" in rep.summary()


def test_export_validates_arguments(tiny_decoder, tmp_path):
    with pytest.raises(ValueError, match="opset must be an int >= 18"):
        ox.export_codec_onnx(tiny_decoder, str(tmp_path / "x.onnx"), opset=17)
    with pytest.raises(ValueError, match="example_batch must be an int >= 2"):
        ox.export_codec_onnx(tiny_decoder, str(tmp_path / "x.onnx"), example_batch=1)


@pytest.mark.parametrize("text, err", [("2x", "not BATCHxFRAMES"), ("0x3", ">= 1"), ("a", "not BATCHxFRAMES")])
def test_parse_shapes_errors(text, err):
    with pytest.raises(ValueError, match=err):
        ox.parse_shapes(text)
    assert ox.parse_shapes(" 1x2, 3X4") == [(1, 2), (3, 4)]


# --- export script on the tiny checkpoint (subprocess, as documented in export/README.md) ------


def test_export_script_on_tiny_checkpoint(tiny_checkpoint, tmp_path):
    out = tmp_path / "sub" / "codec.onnx"
    r = _run(
        [
            EXPORT / "export_codec_onnx.py",
            "--checkpoint",
            tiny_checkpoint,
            "--out",
            out,
            "--parity-shapes",
            "1x1,2x7,2x80",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.is_file()
    assert "trt fusion barrier: around" in r.stdout
    assert "barrier check: max |with - without| = " in r.stdout
    assert "parity OK" in r.stdout and "row   batch=  2 frames=  80" in r.stdout
    import onnx

    assert ox.count_barrier_nodes(onnx.load(str(out))) == 6


def test_export_script_without_barrier(tiny_checkpoint, tmp_path):
    out = tmp_path / "plain.onnx"
    r = _run(
        [
            EXPORT / "export_codec_onnx.py",
            "--checkpoint",
            tiny_checkpoint,
            "--out",
            out,
            "--no-trt-fusion-barrier",
            "--parity-shapes",
            "2x3",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trt fusion barrier: off" in r.stdout
    import onnx

    assert ox.count_barrier_nodes(onnx.load(str(out))) == 0


def test_export_script_fails_when_parity_fails(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """The script's exit code follows the parity verdict (a report that fails -> exit 1)."""
    mod = _script("export_codec_onnx")
    real = ox.check_parity

    def failing(*a, **kw):
        rep = real(*a, **kw)
        rep.errors.append("injected failure")
        return rep

    monkeypatch.setattr(ox, "check_parity", failing)
    rc = mod.main(["--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "m.onnx"), "--parity-shapes", "1x2"])
    assert rc == 1
    assert "parity FAILED" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, err",
    [
        (["--parity-shapes", "2by3"], "--parity-shapes: shape '2by3' is not BATCHxFRAMES"),
        (["--opset", "17"], "--opset must be >= 18"),
        (["--atol", "0"], "--atol must be > 0"),
    ],
)
def test_export_script_argument_errors(args, err, tmp_path):
    r = _run([EXPORT / "export_codec_onnx.py", "--checkpoint", tmp_path, *args], timeout=120)
    assert r.returncode == 2 and err in r.stderr, r.stderr


def test_export_script_missing_checkpoint(tmp_path):
    r = _run([EXPORT / "export_codec_onnx.py", "--checkpoint", tmp_path / "nope"], timeout=120)
    assert r.returncode == 2 and "checkpoint directory not found" in r.stderr


# --- TensorRT scripts: argument validation runs without TensorRT --------------------------------


def test_shape_profile_validation_and_test_shapes():
    p = ShapeProfile((1, 8, 64), (1, 97, 97))
    assert p.shapes() == ((1, 1, 16), (8, 97, 16), (64, 97, 16))
    shapes = p.test_shapes()
    assert (1, 1) in shapes and (64, 97) in shapes and (8, 97) in shapes
    assert all(p.contains(b, t) for b, t in shapes) and len(set(shapes)) == len(shapes)
    assert not p.contains(65, 10) and not p.contains(1, 98)
    for batch, frames, err in [
        ((0, 1, 2), (1, 2, 3), "batch profile: MIN must be >= 1"),
        ((2, 1, 3), (1, 2, 3), r"batch profile: need MIN <= OPT <= MAX, got 2 1 3"),
        ((1, 1, 257), (1, 2, 3), "batch profile: MAX must be <= 256"),
        ((1, 1, 2), (1, 9000, 9000), "frames profile: MAX must be <= 8192"),
        ((1, 1, 2), (3, 2, 4), "frames profile: need MIN <= OPT <= MAX"),
        ((1, 1), (1, 2, 3), "batch profile must be 3 ints"),
    ]:
        with pytest.raises(ValueError, match=err):
            ShapeProfile(batch, frames)


@pytest.fixture
def fake_onnx(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(b"not parsed before TensorRT is found")
    return p


@pytest.mark.parametrize(
    "args, err",
    [
        (["--batch-profile", "1", "8", "300"], "batch profile: MAX must be <= 256"),
        (["--batch-profile", "4", "2", "8"], "batch profile: need MIN <= OPT <= MAX"),
        (["--batch-profile", "0", "2", "8"], "batch profile: MIN must be >= 1"),
        (["--frames-profile", "1", "97", "9000"], "frames profile: MAX must be <= 8192"),
        (["--frames-profile", "1", "2"], "expected 3 arguments"),
        (["--workspace-mib", "0"], "--workspace-mib must be >= 1"),
        (["--opt-level", "7"], "invalid choice"),
    ],
)
def test_build_trt_engine_argument_errors(args, err, fake_onnx, capsys):
    mod = _script("build_trt_engine")
    with pytest.raises(SystemExit) as e:
        mod.main(["--onnx", str(fake_onnx), *args])
    assert e.value.code == 2
    assert err in capsys.readouterr().err


def test_build_trt_engine_missing_onnx(tmp_path, capsys):
    mod = _script("build_trt_engine")
    with pytest.raises(SystemExit) as e:
        mod.main(["--onnx", str(tmp_path / "none.onnx")])
    assert e.value.code == 2 and "--onnx: file not found" in capsys.readouterr().err


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed: the missing-TensorRT path cannot run")
def test_build_trt_engine_without_tensorrt_exits_3(fake_onnx, tmp_path):
    out = tmp_path / "model.plan"
    r = _run([EXPORT / "build_trt_engine.py", "--onnx", fake_onnx, "--out", out], timeout=120)
    assert r.returncode == EXIT_NO_TENSORRT == 3
    assert "TensorRT (python package `tensorrt`) is not installed" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "args, err",
    [
        (["--shapes", "65x2"], "--shapes outside the profile"),
        (["--shapes", "2x98"], "--shapes outside the profile"),
        (["--shapes", "2by9"], "--shapes: shape '2by9' is not BATCHxFRAMES"),
        (["--batch-profile", "1", "8", "257"], "batch profile: MAX must be <= 256"),
        (["--atol", "-1"], "--atol must be >= 0"),
    ],
)
def test_check_parity_argument_errors(args, err, fake_onnx, capsys):
    mod = _script("check_parity")
    with pytest.raises(SystemExit) as e:
        mod.main(["--onnx", str(fake_onnx), "--engine", str(fake_onnx), *args])
    assert e.value.code == 2
    assert err in capsys.readouterr().err


def test_check_parity_tolerances_and_shapes(fake_onnx):
    mod = _script("check_parity")
    a = mod.parse_args(["--onnx", str(fake_onnx), "--engine", str(fake_onnx)])
    assert (a.atol, a.rtol, a.mean_atol) == (5e-2, 0.0, 5e-3)  # fp16 default
    a = mod.parse_args(
        [
            "--onnx",
            str(fake_onnx),
            "--engine",
            str(fake_onnx),
            "--fp32",
            "--batch-profile",
            "1",
            "2",
            "4",
            "--frames-profile",
            "2",
            "8",
            "16",
        ]
    )
    assert (a.atol, a.rtol, a.mean_atol) == (1e-3, 0.0, 1e-4)
    assert all(1 <= b <= 4 and 2 <= t <= 16 for b, t in a.shape_list)
    a = mod.parse_args(["--onnx", str(fake_onnx), "--engine", str(fake_onnx), "--atol", "0.2", "--shapes", "3x5"])
    assert a.atol == 0.2 and a.shape_list == [(3, 5)]


def test_check_parity_missing_engine(fake_onnx, tmp_path, capsys):
    mod = _script("check_parity")
    with pytest.raises(SystemExit) as e:
        mod.main(["--onnx", str(fake_onnx), "--engine", str(tmp_path / "none.plan")])
    assert e.value.code == 2 and "--engine: file not found" in capsys.readouterr().err


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed: the missing-TensorRT path cannot run")
def test_check_parity_without_tensorrt_exits_3(fake_onnx):
    r = _run([EXPORT / "check_parity.py", "--onnx", fake_onnx, "--engine", fake_onnx], timeout=120)
    assert r.returncode == 3
    assert "TensorRT (python package `tensorrt`) is not installed" in r.stderr


@needs_trt
def test_trt_build_and_parity_on_tiny_export(tiny_onnx, tmp_path):
    """Build an fp32 engine of the tiny export and compare with onnxruntime (GPU + TensorRT)."""
    plan = tmp_path / "model.plan"
    prof = ["--batch-profile", "1", "2", "4", "--frames-profile", "1", "16", "32"]
    r = _run(
        [
            EXPORT / "build_trt_engine.py",
            "--onnx",
            tiny_onnx[1],
            "--out",
            plan,
            "--fp32",
            "--timing-cache",
            tmp_path / "cache",
            *prof,
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run([EXPORT / "check_parity.py", "--onnx", tiny_onnx[1], "--engine", plan, "--fp32", *prof])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity PASSED" in r.stdout


# --- real size -----------------------------------------------------------------------------


@pytest.mark.slow
def test_real_size_export_and_parity(tmp_path):
    """The real 114M-parameter decoder (random weights): export, barrier no-op, ORT parity."""
    codec = importlib.import_module("triton_qwen3_tts.model.codec")
    import torch

    from triton_qwen3_tts.model.config import SpeechTokenizerConfig
    from triton_qwen3_tts.model.presets import speech_tokenizer_config

    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = SpeechTokenizerConfig.from_dict(speech_tokenizer_config("1.7b-customvoice")).decoder
    dec = codec.CodecDecoder(cfg).eval()
    codec.init_random_codec_weights(dec, seed=0)
    n = sum(p.numel() for p in dec.parameters())
    assert 100e6 < n < 130e6
    t0 = time.time()
    plain, path = str(tmp_path / "plain.onnx"), str(tmp_path / "codec.onnx")
    ox.export_codec_onnx(dec, plain, trt_fusion_barrier=False)
    ox.apply_trt_fusion_barrier_file(plain, path)
    t_export = time.time() - t0
    assert ox.compare_onnx_models(path, plain, [(2, 9)]) <= 1e-6
    t0 = time.time()
    rep = ox.check_parity(dec, path, shapes=[(1, 2), (2, 25), (2, 97)], atol=1e-4, samples_per_frame=1920)
    print(
        f"\nreal-size decoder {n / 1e6:.1f}M params: export {t_export:.1f}s, parity {time.time() - t0:.1f}s\n"
        + rep.summary()
    )
    assert rep.ok, rep.summary()
