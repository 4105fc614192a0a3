"""TensorRT build and parity helpers for the STATEFUL codec ONNX (docs/design/stateful-codec.md).

``export/export_codec_stateful_onnx.py`` writes the ONNX (inputs ``audio_codes`` INT64
``[batch, frames, 16]`` then one ``state_in_<name>`` per state tensor, ``[batch, *row_shape]``;
outputs ``audio_values`` then ``state_out_<name>``). ``export/build_trt_engine.py --stateful`` and
``export/check_parity.py --stateful`` use this module. Everything here is pure (no TensorRT import):
the state layout comes from the same code the ONNX export uses
(:meth:`StatefulCodecDecoder.onnx_state_names` and :meth:`~StatefulCodecDecoder.state_shapes`),
built on the meta device from a checkpoint's ``config.json`` or a preset, so nothing is hard-coded
and no weights are read.

The optimization profile: ``audio_codes`` over batch MIN..OPT..MAX and frames MIN..OPT..MAX; every
state input over the same batch range with its fixed per-row dims (``state_in_pos`` is ``[batch]``,
int64). Frames are the NEW frames of one call: with the default chunk schedule at most 25 (the tts
also primes reference codes in 25-frame pieces), hence the default frames profile ``1 25 25``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from triton_qwen3_tts.export.codec_onnx import (
    DEFAULT_ONNX_PATH,
    DEFAULT_PLAN_PATH,
    INPUT_NAME,
    NUM_QUANTIZERS,
    OUTPUT_NAME,
    ShapeProfile,
)

DEFAULT_STATEFUL_ONNX_PATH = os.path.join("build", "codec_decoder_stateful.onnx")
DEFAULT_STATEFUL_PLAN_PATH = os.path.join("build", "codec_decoder_stateful.plan")
DEFAULT_STATEFUL_BATCH_PROFILE = (1, 8, 64)
DEFAULT_STATEFUL_FRAMES_PROFILE = (1, 25, 25)

# precision -> (audio atol, audio mean atol, state tolerance relative to max(1, |state|))
STATEFUL_TOLERANCES: Dict[str, Tuple[float, float, float]] = {
    "fp32": (1e-3, 1e-4, 1e-3),
    "fp16": (5e-2, 5e-3, 5e-2),
}


@dataclass(frozen=True)
class StateIO:
    name: str  # decoder state name, e.g. "attn.0.k"
    input_name: str  # "state_in_attn_0_k"
    output_name: str  # "state_out_attn_0_k"
    row_shape: Tuple[int, ...]  # per-row shape as in the ONNX ([] for pos)
    is_float: bool


def state_io(sd) -> List[StateIO]:
    """The state I/O of a :class:`~triton_qwen3_tts.model.stateful_codec.StatefulCodecDecoder` (or any
    object with its layout API), in flatten order: names from ``onnx_state_names``, shapes from
    ``state_shapes`` (the ONNX export feeds exactly these)."""
    ins, outs = sd.onnx_state_names()
    shapes = sd.state_shapes(1)
    names = list(sd.state_names())
    if not (len(names) == len(ins) == len(outs) == len(shapes)):
        raise ValueError("state layout: names, ONNX names and shapes disagree in length")
    return [StateIO(n, i, o, tuple(int(x) for x in shapes[n][1:]), n != "pos") for n, i, o in zip(names, ins, outs)]


def stateful_decoder_meta(checkpoint: Optional[str] = None, preset: Optional[str] = None):
    """A ``StatefulCodecDecoder`` on the meta device (layout only, no weights) of a checkpoint
    directory (reads ``speech_tokenizer/config.json``) or of a ``presets`` name."""
    import torch

    from triton_qwen3_tts.model.codec import CodecDecoder
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.model.config import CodecDecoderConfig, SpeechTokenizerConfig

    if (checkpoint is None) == (preset is None):
        raise ValueError("give exactly one of checkpoint or preset")
    if checkpoint is not None:
        path = os.path.join(checkpoint, "speech_tokenizer", "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} not found (not a Qwen3-TTS checkpoint directory)")
        cfg = SpeechTokenizerConfig.from_file(path).decoder
    else:
        from triton_qwen3_tts.model import presets

        if preset not in presets.PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known: {', '.join(presets.PRESETS)}")
        cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config(preset)["decoder_config"])
    with torch.device("meta"):
        dec = CodecDecoder(cfg)
    return StatefulCodecDecoder(dec)


def apply_mode_defaults(args, plan_attr: str) -> None:
    """Fill what the export scripts leave at None for the chosen mode (windowed or ``--stateful``):
    ``args.onnx``, the engine path ``args.<plan_attr>``, ``args.batch_profile`` and
    ``args.frames_profile``. Shared by ``build_trt_engine.py`` (``out``) and ``check_parity.py``
    (``engine``)."""
    st = args.stateful
    if args.onnx is None:
        args.onnx = DEFAULT_STATEFUL_ONNX_PATH if st else DEFAULT_ONNX_PATH
    if getattr(args, plan_attr) is None:
        setattr(args, plan_attr, DEFAULT_STATEFUL_PLAN_PATH if st else DEFAULT_PLAN_PATH)
    if args.batch_profile is None:
        args.batch_profile = list(DEFAULT_STATEFUL_BATCH_PROFILE) if st else [1, 8, 64]
    if args.frames_profile is None:
        args.frames_profile = list(DEFAULT_STATEFUL_FRAMES_PROFILE) if st else [1, 97, 97]


def state_io_from_args(args, stateful_only: Sequence[str] = ("--checkpoint", "--preset")) -> Optional[List[StateIO]]:
    """The state layout named by ``--checkpoint`` / ``--preset`` with ``--stateful`` (None without
    it). ``stateful_only``: the flags that make sense only with ``--stateful``, as named in the
    error. Raises ValueError with the message the scripts pass to ``argparse.error``."""
    if args.stateful:
        if (args.checkpoint is None) == (args.preset is None):
            raise ValueError("--stateful needs exactly one of --checkpoint DIR or --preset NAME (the state layout)")
        try:
            return state_io(stateful_decoder_meta(args.checkpoint, args.preset))
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"--stateful: {e}") from None
    given = [getattr(args, f.lstrip("-").replace("-", "_")) for f in stateful_only]
    if any(v is not None and v is not False for v in given):
        raise ValueError(f"{' / '.join(stateful_only)} only go with --stateful")
    return None


def stateful_profile(io: Sequence[StateIO], profile: ShapeProfile) -> "OrderedDict[str, Tuple[tuple, tuple, tuple]]":
    """``input name -> (min, opt, max)`` shapes for every input of the stateful engine."""
    out: "OrderedDict[str, Tuple[tuple, tuple, tuple]]" = OrderedDict()
    out[INPUT_NAME] = profile.shapes()
    for s in io:
        out[s.input_name] = tuple((profile.batch[k],) + s.row_shape for k in range(3))  # type: ignore[assignment]
    return out


def expected_io(io: Sequence[StateIO]) -> Tuple["OrderedDict[str, tuple]", "OrderedDict[str, tuple]"]:
    """``(inputs, outputs)``: name -> shape with -1 for the dynamic axes, as in the ONNX."""
    ins: "OrderedDict[str, tuple]" = OrderedDict([(INPUT_NAME, (-1, -1, NUM_QUANTIZERS))])
    outs: "OrderedDict[str, tuple]" = OrderedDict([(OUTPUT_NAME, (-1, -1))])
    for s in io:
        ins[s.input_name] = (-1,) + s.row_shape
        outs[s.output_name] = (-1,) + s.row_shape
    return ins, outs


def check_io(
    actual: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]], what: str, dynamic_ok: bool = False
) -> List[str]:
    """Problems between a network's (or ONNX's) I/O ``name -> shape`` (dynamic axes negative or
    None) and the expected one; empty when they agree. ``dynamic_ok``: an actual dynamic dim
    matches any expected size (outputs: the exporter leaves sliced state outputs symbolic; their
    runtime shapes are checked by the parity run)."""

    def norm(shape):
        return tuple(
            -1 if (d is None or (isinstance(d, int) and d < 0) or not isinstance(d, int)) else int(d) for d in shape
        )

    problems = []
    missing = [n for n in expected if n not in actual]
    extra = [n for n in actual if n not in expected]
    if missing:
        problems.append(f"{what} missing: {', '.join(missing)}")
    if extra:
        problems.append(f"{what} not in the state layout: {', '.join(extra)}")
    for n, want in expected.items():
        got = norm(actual[n]) if n in actual else None
        if got is None:
            continue
        same = len(got) == len(want) and all(g == w or (dynamic_ok and g == -1) for g, w in zip(got, want))
        if not same:
            problems.append(f"{what} {n}: shape {list(norm(actual[n]))}, expected {list(want)}")
    return problems


def onnx_io_shapes(path: str) -> Tuple["OrderedDict[str, tuple]", "OrderedDict[str, tuple]"]:
    """``(inputs, outputs)`` name -> shape (-1 for symbolic dims) of an ONNX file (weights not loaded)."""
    import onnx

    m = onnx.load(path, load_external_data=False)

    def shape(v):
        return tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)

    inits = {i.name for i in m.graph.initializer}
    ins = OrderedDict((v.name, shape(v)) for v in m.graph.input if v.name not in inits)
    outs = OrderedDict((v.name, shape(v)) for v in m.graph.output)
    return ins, outs


def row_positions(batch: int, max_pos: int = 90) -> List[int]:
    """Distinct warm-up lengths (frames decoded before the checked call) per row: 0 for row 0,
    then spread over 1..max_pos (past the 71-frame KV window for the later rows)."""
    return [0] + [1 + (37 * i) % max_pos for i in range(1, batch)]


def compare_state(
    ref: Mapping[str, object], got: Mapping[str, object], io: Sequence[StateIO]
) -> Tuple[float, List[str]]:
    """``(max relative |diff| over float states, problems)``: NaN/Inf in ``got``, shape mismatch,
    or an int state (``pos``) that is not exactly equal. Relative = |diff| / max(1, max|ref|)."""
    import numpy as np

    worst, problems = 0.0, []
    for s in io:
        r, g = np.asarray(ref[s.output_name]), np.asarray(got[s.output_name])
        if r.shape != g.shape:
            problems.append(f"{s.output_name}: shape {list(g.shape)}, expected {list(r.shape)}")
            continue
        if s.is_float:
            if not np.isfinite(g).all():
                problems.append(f"{s.output_name}: {int((~np.isfinite(g)).sum())} NaN/Inf values")
                continue
            scale = max(1.0, float(np.abs(r).max()) if r.size else 1.0)
            worst = max(worst, float(np.abs(g.astype(np.float64) - r).max()) / scale if r.size else 0.0)
        elif not np.array_equal(r, g):
            problems.append(
                f"{s.output_name}: int state differs ({g.reshape(-1)[:4].tolist()} vs {r.reshape(-1)[:4].tolist()})"
            )
    return worst, problems
