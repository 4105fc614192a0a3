"""Export the codec decoder to ONNX (for TensorRT) and check it against PyTorch.

Contract of the exported model (what ``model_repository/codec_decoder`` serves):

* input  ``audio_codes``  INT64 ``[batch, frames, 16]`` (left-context frames included),
* output ``audio_values`` FP32  ``[batch, frames * 1920]`` (24 kHz mono),
* opset >= 18, fp32 weights, dynamic ``batch`` and ``frames`` axes.

The wrapper transposes to the decoder's official ``[B, 16, T]`` layout and drops the channel axis.
The legacy TorchScript exporter is used (``dynamo=False``): the dynamo exporter needs
``onnxscript``, which the environment does not have, and the TorchScript path is the one an
earlier Triton + TensorRT design for Qwen3-TTS shipped
(https://github.com/vllm-project/vllm-omni/pull/3221).

TensorRT fusion barrier: TensorRT 10.x fused across the Transpose that follows the decoder's
pre-transformer (``pre_transformer.output_proj`` -> Transpose -> upsample stage) and produced
silently wrong audio at dynamic batch > 1. We insert ``Add(x, zero)`` right before and right
after that Transpose. ``zero`` is ``Sub(c, c)`` where ``c`` is a one-element-per-row slice of the
tensor itself, i.e. computed at runtime: constant folding (ONNX, polygraphy or TensorRT) cannot
remove it, while an Identity or Cast barrier would be folded away. The slice is per batch row, so
the barrier never mixes rows. It is numerically a no-op for finite values (checked in tests).

This module imports torch and onnx, never vLLM or Triton.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

log = logging.getLogger(__name__)

INPUT_NAME = "audio_codes"
OUTPUT_NAME = "audio_values"
NUM_QUANTIZERS = 16
MIN_OPSET = 18
DEFAULT_OPSET = 18
DEFAULT_ONNX_PATH = os.path.join("build", "codec_decoder.onnx")
# Names of the nodes this module adds; used to find (and count) the barrier afterwards.
BARRIER_PREFIX = "trt_fusion_barrier"
# Default (batch, frames) pairs for the parity check: batch 1 and > 1, frames 1 (the smallest
# chunk), below and above the 72-frame sliding window, and the default max window 97.
DEFAULT_PARITY_SHAPES: Tuple[Tuple[int, int], ...] = ((1, 1), (1, 2), (2, 13), (3, 37), (2, 97))


class ExportError(RuntimeError):
    """The export or its post-processing could not be done as required."""


# --------------------------------------------------------------------------------------------
# Loading and wrapping


def load_decoder_from_checkpoint(checkpoint_dir: str):
    """The package's ``CodecDecoder`` (fp32, eval, CPU) and its ``SpeechTokenizerConfig``.

    Accepts a Qwen3-TTS checkpoint directory in the official layout (``<dir>/speech_tokenizer/``).
    Only the decoder's tensors are read, after the checkpoint loader's layout validation (a wrong
    or partial checkpoint fails with one clear error instead of exporting noise).
    """
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"checkpoint directory not found: {checkpoint_dir}")
    from triton_qwen3_tts.model.checkpoint import load_codec_decoder, load_speech_tokenizer_config

    st_cfg = load_speech_tokenizer_config(checkpoint_dir)
    decoder = load_codec_decoder(checkpoint_dir, device="cpu", st_config=st_cfg)
    return decoder.float().eval(), st_cfg


def make_export_module(decoder):
    """Wrap ``decoder`` (forward ``[B, 16, T] -> [B, 1, T*spf]``) into the served I/O layout
    ``[B, T, 16] int64 -> [B, T*spf] float32``."""
    import torch

    class CodecExportWrapper(torch.nn.Module):
        def __init__(self, dec):
            super().__init__()
            self.decoder = dec

        def forward(self, audio_codes):  # [B, T, 16] int64
            return self.decoder(audio_codes.transpose(1, 2))[:, 0]

    return CodecExportWrapper(decoder).eval()


# --------------------------------------------------------------------------------------------
# Export


@dataclass
class ExportResult:
    path: str
    opset: int
    barrier_transpose: Optional[str]  # name of the Transpose wrapped by the barrier, if any
    num_nodes: int


def export_codec_onnx(
    decoder,
    path: str,
    opset: int = DEFAULT_OPSET,
    trt_fusion_barrier: bool = True,
    example_batch: int = 2,
    example_frames: int = 11,
    codebook_size: int = 2048,
) -> ExportResult:
    """Export ``decoder`` to ``path`` with dynamic batch and frames axes.

    The trace uses batch 2 and an odd frame count so the tracer cannot specialise either axis to
    a value that also appears elsewhere (1, 16). ``trt_fusion_barrier`` inserts the Add(x, zero)
    barrier around the post-pre-transformer Transpose (see the module docstring).
    """
    import onnx
    import torch

    if isinstance(opset, bool) or not isinstance(opset, int) or opset < MIN_OPSET:
        raise ValueError(f"opset must be an int >= {MIN_OPSET}, got {opset!r}")
    for name, v in (("example_batch", example_batch), ("example_frames", example_frames)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise ValueError(f"{name} must be an int >= 2 (1 would be specialised by the tracer), got {v!r}")
    module = make_export_module(decoder.float().eval())
    gen = torch.Generator().manual_seed(0)
    example = torch.randint(0, codebook_size, (example_batch, example_frames, NUM_QUANTIZERS), generator=gen)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    import warnings

    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of dynamo (needs onnxscript); the
        # deprecation and tracer warnings are expected here.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            path,
            dynamo=False,
            opset_version=opset,
            do_constant_folding=True,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch", 1: "frames"}, OUTPUT_NAME: {0: "batch", 1: "samples"}},
        )
    model = onnx.load(path)
    barrier_at = None
    if trt_fusion_barrier:
        barrier_at = insert_trt_fusion_barrier(model)
    _set_io_shapes(model)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return ExportResult(path, opset, barrier_at, len(model.graph.node))


def _set_io_shapes(model) -> None:
    """Name the dynamic dims and fix the codebook axis (16) in the graph I/O."""
    (inp,) = [i for i in model.graph.input if i.name == INPUT_NAME]
    dims = inp.type.tensor_type.shape.dim
    dims[0].dim_param, dims[1].dim_param = "batch", "frames"
    dims[2].dim_value = NUM_QUANTIZERS
    (out,) = [o for o in model.graph.output if o.name == OUTPUT_NAME]
    odims = out.type.tensor_type.shape.dim
    if len(odims) == 2:
        odims[0].dim_param, odims[1].dim_param = "batch", "samples"


# --------------------------------------------------------------------------------------------
# TensorRT fusion barrier


def _consumers(graph):
    out = {}
    for n in graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def _producers(graph):
    return {o: n for n in graph.node for o in n.output}


def find_post_transformer_transpose(model):
    """The Transpose node that follows ``pre_transformer.output_proj``.

    Two independent ways, which must agree when both succeed:

    1. forward: from the node(s) of ``pre_transformer/output_proj`` (by node name, or by an
       initializer named ``...pre_transformer.output_proj...``), follow consumers to the first
       Transpose;
    2. backward: from the first ConvTranspose (the first upsample stage), follow producers back
       to the nearest Transpose.
    """
    g = model.graph
    cons, prods = _consumers(g), _producers(g)
    inits = {i.name for i in g.initializer}

    def is_out_proj(n) -> bool:
        if "pre_transformer/output_proj" in n.name:
            return True
        return any(i in inits and "pre_transformer.output_proj" in i for i in n.input)

    forward = None
    starts = [n for n in g.node if is_out_proj(n)]
    seen, frontier = set(), [o for n in starts for o in n.output]
    while frontier and forward is None:
        nxt = []
        for t in frontier:
            for c in cons.get(t, []):
                if id(c) in seen:
                    continue
                seen.add(id(c))
                if c.op_type == "Transpose" and not is_out_proj(c):
                    forward = c
                    break
                nxt.extend(c.output)
            if forward is not None:
                break
        frontier = nxt

    backward = None
    conv_t = next((n for n in g.node if n.op_type == "ConvTranspose"), None)
    if conv_t is not None:
        seen, frontier = set(), [conv_t.input[0]]
        while frontier and backward is None:
            nxt = []
            for t in frontier:
                p = prods.get(t)
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                if p.op_type == "Transpose":
                    backward = p
                    break
                if p.op_type in ("MatMul", "Gemm", "Conv"):
                    continue  # do not walk past a weight layer: that is another stage
                nxt.extend(p.input[:1] if p.op_type not in ("Add", "Mul", "Sub") else p.input)
            frontier = nxt

    if forward is not None and backward is not None and forward is not backward:
        raise ExportError(
            f"ambiguous TRT fusion barrier site: {forward.name!r} (after pre_transformer.output_proj) "
            f"vs {backward.name!r} (before the first ConvTranspose)"
        )
    node = forward or backward
    if node is None:
        raise ExportError(
            "could not find the Transpose after pre_transformer.output_proj in the exported graph; "
            "export with --no-trt-fusion-barrier to skip the TensorRT workaround"
        )
    return node


def insert_trt_fusion_barrier(model) -> str:
    """Insert ``Add(x, Sub(c, c))`` before and after the post-transformer Transpose, in place.

    ``c`` is ``x[:, :1, :1]`` (a per-row runtime slice), so ``zero`` has shape ``[B, 1, 1]`` and
    broadcasts. Returns the Transpose's name. Refuses to insert twice.
    """
    from onnx import helper, numpy_helper

    g = model.graph
    if any(n.name.startswith(BARRIER_PREFIX) for n in g.node):
        raise ExportError("the model already has a TRT fusion barrier")
    tr = find_post_transformer_transpose(model)
    name = tr.name or "transpose"
    p = BARRIER_PREFIX
    consts = [
        numpy_helper.from_array(np.array([0, 0], np.int64), f"{p}/starts"),
        numpy_helper.from_array(np.array([1, 1], np.int64), f"{p}/ends"),
        numpy_helper.from_array(np.array([1, 2], np.int64), f"{p}/axes"),
    ]
    g.initializer.extend(consts)

    def barrier(x: str, tag: str) -> Tuple[List, str]:
        c, z, y = f"{p}/{tag}/c", f"{p}/{tag}/zero", f"{p}/{tag}/out"
        nodes = [
            helper.make_node("Slice", [x, f"{p}/starts", f"{p}/ends", f"{p}/axes"], [c], name=f"{p}/{tag}/Slice"),
            helper.make_node("Sub", [c, c], [z], name=f"{p}/{tag}/Sub"),
            helper.make_node("Add", [x, z], [y], name=f"{p}/{tag}/Add"),
        ]
        return nodes, y

    # Before: feed the Transpose from Add(x, zero).
    pre_nodes, pre_out = barrier(tr.input[0], "pre")
    tr.input[0] = pre_out
    # After: every consumer of the Transpose output reads Add(y, zero) instead.
    old_out = tr.output[0]
    post_nodes, post_out = barrier(old_out, "post")
    for n in g.node:
        for i, inp in enumerate(n.input):
            if inp == old_out:
                n.input[i] = post_out
    for o in g.output:
        if o.name == old_out:  # cannot happen for the codec, but keep the graph valid
            raise ExportError("the barrier Transpose output is a graph output")
    # Keep topological order: insert the pre barrier before the Transpose, the post after it.
    nodes = list(g.node)
    idx = next(i for i, n in enumerate(nodes) if n is tr or (n.name == tr.name and n.output == tr.output))
    new = nodes[:idx] + pre_nodes + [nodes[idx]] + post_nodes + nodes[idx + 1 :]
    del g.node[:]
    g.node.extend(new)
    return name


def apply_trt_fusion_barrier_file(src: str, dst: str) -> str:
    """Load ``src``, insert the barrier, check and save to ``dst``; return the Transpose's name."""
    import onnx

    model = onnx.load(src)
    name = insert_trt_fusion_barrier(model)
    onnx.checker.check_model(model)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    onnx.save(model, dst)
    return name


def count_barrier_nodes(model) -> int:
    return sum(1 for n in model.graph.node if n.name.startswith(BARRIER_PREFIX))


# --------------------------------------------------------------------------------------------
# Parity


@dataclass
class ParityCase:
    batch: int
    frames: int
    max_abs: float
    mean_abs: float
    kind: str = "batch"  # "batch" (ORT vs torch) or "row" (ORT row alone vs ORT in the batch)

    def line(self) -> str:
        return (
            f"{self.kind:5s} batch={self.batch:3d} frames={self.frames:4d} "
            f"max_abs={self.max_abs:.3e} mean_abs={self.mean_abs:.3e}"
        )


@dataclass
class ParityReport:
    atol: float
    cases: List[ParityCase] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    @property
    def max_abs(self) -> float:
        return max((c.max_abs for c in self.cases), default=0.0)

    @property
    def ok(self) -> bool:
        return not self.errors and all(c.max_abs <= self.atol for c in self.cases)

    def summary(self) -> str:
        lines = [c.line() for c in self.cases] + [f"ERROR {e}" for e in self.errors]
        mean = float(np.mean([c.mean_abs for c in self.cases])) if self.cases else 0.0
        lines.append(
            f"parity {'OK' if self.ok else 'FAILED'}: max_abs={self.max_abs:.3e} "
            f"mean_abs={mean:.3e} atol={self.atol:.1e} cases={len(self.cases)}"
        )
        return "\n".join(lines)


def ort_session(path: str):
    """An onnxruntime CPU session (CPU EP only: the CUDA EP's TF32/fused kernels are not a parity
    reference). Threads are capped to 2: the build/CI machines are small and shared."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(os.environ.get("QWEN3_TTS_ORT_THREADS", "2"))
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def random_codes(batch: int, frames: int, codebook_size: int = 2048, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, codebook_size, size=(batch, frames, NUM_QUANTIZERS), dtype=np.int64)


def check_parity(
    decoder,
    onnx_path: str,
    shapes: Iterable[Tuple[int, int]] = DEFAULT_PARITY_SHAPES,
    atol: float = 1e-4,
    codebook_size: int = 2048,
    seed: int = 0,
    samples_per_frame: Optional[int] = None,
    session=None,
) -> ParityReport:
    """ORT (CPU) vs PyTorch fp32 for each (batch, frames); and per-row independence: each row of
    a batch decoded alone through ORT equals that row of the batched ORT output (this is what
    breaks when a backend mixes rows, as TensorRT did without the barrier)."""
    import torch

    module = make_export_module(decoder.float().eval())
    sess = session or ort_session(onnx_path)
    rep = ParityReport(atol=atol)
    for k, (b, t) in enumerate(shapes):
        codes = random_codes(b, t, codebook_size, seed + k)
        with torch.inference_mode():
            ref = module(torch.from_numpy(codes)).numpy()
        got = sess.run([OUTPUT_NAME], {INPUT_NAME: codes})[0]
        if samples_per_frame is not None and got.shape != (b, t * samples_per_frame):
            rep.errors.append(f"batch={b} frames={t}: output shape {got.shape}, expected {(b, t * samples_per_frame)}")
            continue
        if got.shape != ref.shape or got.dtype != np.float32:
            rep.errors.append(f"batch={b} frames={t}: output {got.shape} {got.dtype} vs torch {ref.shape} float32")
            continue
        if not np.isfinite(got).all():
            rep.errors.append(f"batch={b} frames={t}: non-finite values in the ONNX output")
            continue
        d = np.abs(got.astype(np.float64) - ref)
        rep.cases.append(ParityCase(b, t, float(d.max()), float(d.mean()), "batch"))
        if b > 1:
            worst, means = 0.0, []
            for i in range(b):
                alone = sess.run([OUTPUT_NAME], {INPUT_NAME: codes[i : i + 1]})[0][0]
                di = np.abs(alone.astype(np.float64) - got[i])
                worst, means = max(worst, float(di.max())), means + [float(di.mean())]
            rep.cases.append(ParityCase(b, t, worst, float(np.mean(means)), "row"))
    return rep


def compare_onnx_models(
    path_a: str, path_b: str, shapes: Sequence[Tuple[int, int]], codebook_size: int = 2048
) -> float:
    """Max abs difference between two ONNX models' outputs on random codes (barrier check)."""
    sa, sb = ort_session(path_a), ort_session(path_b)
    worst = 0.0
    for k, (b, t) in enumerate(shapes):
        codes = random_codes(b, t, codebook_size, 100 + k)
        ya = sa.run([OUTPUT_NAME], {INPUT_NAME: codes})[0]
        yb = sb.run([OUTPUT_NAME], {INPUT_NAME: codes})[0]
        worst = max(worst, float(np.abs(ya - yb).max()))
    return worst


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """``"1x1,2x13,3x97"`` -> ``[(1, 1), (2, 13), (3, 97)]`` (batch x frames)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            b, t = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {part!r} is not BATCHxFRAMES (e.g. 2x13)") from None
        if b < 1 or t < 1:
            raise ValueError(f"shape {part!r}: batch and frames must be >= 1")
        out.append((b, t))
    if not out:
        raise ValueError("no shapes given")
    return out


# --------------------------------------------------------------------------------------------
# TensorRT build/parity helpers (argument logic only; tensorrt is imported by the scripts)

MAX_PROFILE_BATCH = 256
# One window never exceeds the generation limit (8192 frames = 655 s: max_new_tokens of the
# official generation_config.json).
MAX_PROFILE_FRAMES = 8192
DEFAULT_PLAN_PATH = os.path.join("model_repository", "codec_decoder", "1", "model.plan")
DEFAULT_TIMING_CACHE = os.path.join("build", "trt_timing.cache")
# Exit codes of the TensorRT scripts: 0 ok, 1 build/parity failed, 2 bad arguments (argparse's
# own convention), 3 TensorRT is not installed.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_TENSORRT = 0, 1, 2, 3
TENSORRT_MISSING = (
    "TensorRT (python package `tensorrt`) is not installed; install TensorRT 10.x for your CUDA "
    "(e.g. `pip install tensorrt` on a machine with an NVIDIA GPU, or use the "
    "nvcr.io/nvidia/tritonserver image) and run this script there"
)


@dataclass(frozen=True)
class ShapeProfile:
    """A TensorRT optimization profile over (batch, frames) for input ``audio_codes``."""

    batch: Tuple[int, int, int]  # min, opt, max
    frames: Tuple[int, int, int]

    def __post_init__(self) -> None:
        for name, triple, hi in (("batch", self.batch, MAX_PROFILE_BATCH), ("frames", self.frames, MAX_PROFILE_FRAMES)):
            if len(triple) != 3 or any(isinstance(v, bool) or not isinstance(v, int) for v in triple):
                raise ValueError(f"{name} profile must be 3 ints MIN OPT MAX, got {triple!r}")
            lo, opt, mx = triple
            if lo < 1:
                raise ValueError(f"{name} profile: MIN must be >= 1, got {lo}")
            if not lo <= opt <= mx:
                raise ValueError(f"{name} profile: need MIN <= OPT <= MAX, got {lo} {opt} {mx}")
            if mx > hi:
                raise ValueError(f"{name} profile: MAX must be <= {hi}, got {mx}")

    def shapes(self) -> Tuple[Tuple[int, int, int], Tuple[int, int, int], Tuple[int, int, int]]:
        """(min, opt, max) input shapes ``[batch, frames, 16]``."""
        return tuple((self.batch[i], self.frames[i], NUM_QUANTIZERS) for i in range(3))  # type: ignore[return-value]

    def contains(self, batch: int, frames: int) -> bool:
        return self.batch[0] <= batch <= self.batch[2] and self.frames[0] <= frames <= self.frames[2]

    def test_shapes(self) -> List[Tuple[int, int]]:
        """Representative (batch, frames) inside the profile: the corners, opt, and an odd middle."""
        b0, bo, b1 = self.batch
        f0, fo, f1 = self.frames
        mid = (max(b0, min(b1, (b0 + b1) // 2 + 1)), max(f0, min(f1, (f0 + f1) // 2 + 1)))
        out: List[Tuple[int, int]] = []
        for s in ((b0, f0), (b0, f1), (bo, fo), mid, (b1, f0), (b1, f1)):
            if s not in out:
                out.append(s)
        return out


def have_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return True
