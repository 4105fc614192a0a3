"""Serving the stateful codec (issue 9): batching logic of ``codec_decoder_stateful`` and the tts's
per-request codec sessions. No Triton import here; torch only where tensors are stacked.

Triton stays stateless: a stream's decoder state travels with each request as explicit
``state_in_<name>`` inputs and comes back as ``state_out_<name>`` outputs
(:class:`~qwen3_tts_triton.codec_stateful.StatefulCodecDecoder`, docs/design/stateful-codec.md).
The codec model therefore batches requests of different streams dynamically:

* :func:`run_batch` groups the requests of one ``execute`` by their number of new frames ``T``
  (one ``step`` needs the same ``T`` for all rows; rows may be at different positions), stacks each
  group's states along the batch axis (all-zero rows for a stream's first chunk), runs one ``step``
  per group (slices of at most ``max_batch`` rows), and splits audio and new states back per request.
* :func:`parse_request` validates one request's tensors (``ValueError`` with a clear message, the
  adapter answers INVALID_ARG).

On the tts side, a request opens a *codec session* (``codec.session()``) with
``async decode(codes, left_context)`` and ``close()``: :class:`WindowedSession` forwards to the
windowed codec; :class:`StatefulSession` keeps the stream's state between chunks and drops it on
``close()`` (called in a ``finally`` on end, error and cancel). :class:`LiveCounter` counts the
sessions holding state (the ``qwen3_tts_codec_states_live`` gauge).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

NUM_QUANTIZERS = 16
POS_NAME = "pos"

_TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}


# ---------------------------------------------------------------------------------------------
# State layout as Triton I/O


@dataclass(frozen=True)
class StateSpec:
    name: str  # decoder state name, e.g. "attn.0.k"
    input_name: str  # "state_in_attn_0_k"
    output_name: str  # "state_out_attn_0_k"
    dims: Tuple[int, ...]  # per-row dims as declared in Triton ([1] for the scalar position)
    is_float: bool


def state_specs(sd) -> List[StateSpec]:
    """The Triton I/O of a :class:`StatefulCodecDecoder` (or any object with the same layout API)."""
    ins, outs = sd.onnx_state_names()
    shapes = sd.state_shapes(1)
    specs = []
    for name, i, o in zip(sd.state_names(), ins, outs):
        dims = tuple(shapes[name][1:]) or (1,)
        specs.append(StateSpec(name, i, o, dims, name != POS_NAME))
    return specs


def state_specs_from_checkpoint(checkpoint_dir: str) -> List[StateSpec]:
    """State specs of a checkpoint's decoder, built on the meta device (reads only config.json)."""
    import os

    import torch

    from ..codec import CodecDecoder
    from ..codec_stateful import StatefulCodecDecoder
    from ..config import SpeechTokenizerConfig

    cfg = SpeechTokenizerConfig.from_file(os.path.join(checkpoint_dir, "speech_tokenizer", "config.json"))
    with torch.device("meta"):
        dec = CodecDecoder(cfg.decoder)
    return state_specs(StatefulCodecDecoder(dec))


def config_io_blocks(specs: Sequence[StateSpec], dtype: str = "float32") -> Tuple[str, str]:
    """``(inputs, outputs)`` pbtxt entries for the state tensors, comma-separated (no trailing comma)."""
    if dtype not in _TRITON_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_TRITON_DTYPES)}, got {dtype!r}")
    ins, outs = [], []
    for s in specs:
        t = _TRITON_DTYPES[dtype] if s.is_float else "TYPE_INT64"
        dims = ", ".join(str(d) for d in s.dims)
        ins.append(f'  {{ name: "{s.input_name}" data_type: {t} dims: [ {dims} ] optional: true }}')
        outs.append(f'  {{ name: "{s.output_name}" data_type: {t} dims: [ {dims} ] }}')
    return ",\n".join(ins), ",\n".join(outs)


def trt_config_io_blocks(specs: Sequence[StateSpec]) -> Tuple[str, str]:
    """``(inputs, outputs)`` pbtxt entries of the state tensors for the TensorRT stateful codec:
    the same names and Triton dims as :func:`config_io_blocks` (float32: the engine's I/O), but
    every state input is required (no optional inputs: a new stream sends an all-zero state, see
    :func:`zero_state_inputs`), and ``pos``, which the engine takes as ``[batch]``, is declared
    ``[1]`` with ``reshape: { shape: [ ] }``."""
    ins, outs = [], []
    for s in specs:
        t = _TRITON_DTYPES["float32"] if s.is_float else "TYPE_INT64"
        dims = ", ".join(str(d) for d in s.dims)
        reshape = " reshape: { shape: [ ] }" if s.name == POS_NAME else ""
        ins.append(f'  {{ name: "{s.input_name}" data_type: {t} dims: [ {dims} ]{reshape} }}')
        outs.append(f'  {{ name: "{s.output_name}" data_type: {t} dims: [ {dims} ]{reshape} }}')
    return ",\n".join(ins), ",\n".join(outs)


def zero_state_inputs(specs: Sequence[StateSpec], dtype=np.float32) -> List[Tuple[str, np.ndarray]]:
    """``(input name, all-zero array [1, *dims])`` per state tensor: a stream's first chunk for a
    codec without optional inputs (TensorRT), instead of ``start=true``. ``pos`` is int64."""
    return [(s.input_name, np.zeros((1,) + tuple(s.dims), dtype if s.is_float else np.int64)) for s in specs]


# ---------------------------------------------------------------------------------------------
# The codec model's batching


@dataclass
class StepRequest:
    """One validated request: ``codes`` int64 ``[b, T, 16]`` and its state (None: start from zero)."""

    codes: Any  # torch.LongTensor [b, T, 16]
    state: Optional[Dict[str, Any]]  # name -> tensor [b, ...] (pos: [b]) or None

    @property
    def rows(self) -> int:
        return int(self.codes.shape[0])

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])


@dataclass
class StepResult:
    audio: Any  # float32 [b, T * spf]
    state: Dict[str, Any]  # name -> tensor [b, ...] (pos: [b, 1]), in the specs' order


def parse_request(codes, start: Optional[bool], states: Mapping[str, Any], specs: Sequence[StateSpec],
                  codebook_size: int = 2048, max_frames: Optional[int] = None, device=None,
                  dtype=None) -> StepRequest:
    """Validate one request's tensors (torch tensors or numpy arrays, keyed by input name).

    ``start`` True: the stream's first chunk, no ``state_in_*`` allowed (zero state). ``start``
    False: every ``state_in_*`` is required. ``start`` None (not sent): start iff no state is sent.
    """
    import torch

    codes = torch.as_tensor(codes)
    if codes.dim() != 3 or codes.shape[2] != NUM_QUANTIZERS:
        raise ValueError(f"audio_codes must have shape [batch, frames, {NUM_QUANTIZERS}], got {list(codes.shape)}")
    if codes.shape[0] < 1 or codes.shape[1] < 1:
        raise ValueError(f"audio_codes must have at least one row and one frame, got {list(codes.shape)}")
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"audio_codes must be integers, got {codes.dtype}")
    if max_frames is not None and codes.shape[1] > max_frames:
        raise ValueError(f"audio_codes has {codes.shape[1]} new frames; the limit is {max_frames}")
    lo, hi = int(codes.min()), int(codes.max())
    if lo < 0 or hi >= codebook_size:
        raise ValueError(f"audio_codes values must be in [0, {codebook_size}), got [{lo}, {hi}]")
    codes = codes.to(device=device, dtype=torch.int64)
    known = {s.input_name for s in specs}
    unknown = sorted(set(states) - known)
    if unknown:
        raise ValueError(f"unknown state input(s) {unknown}")
    if start is None:
        start = not states
    if start:
        if states:
            raise ValueError(f"start=true takes no state_in_* inputs (the codec starts from zero state); "
                             f"got {sorted(states)}")
        return StepRequest(codes, None)
    missing = [s.input_name for s in specs if s.input_name not in states]
    if missing:
        raise ValueError(f"missing state input(s) {missing}: send every state_out_* of the previous chunk "
                         f"as state_in_*, or start=true on a stream's first chunk")
    b = codes.shape[0]
    out = {}
    for s in specs:
        t = torch.as_tensor(states[s.input_name])
        want = (b,) + tuple(s.dims)
        if tuple(t.shape) != want:
            raise ValueError(f"{s.input_name} must have shape {list(want)} (batch {b}), got {list(t.shape)}")
        if s.is_float:
            if not t.dtype.is_floating_point:
                raise ValueError(f"{s.input_name} must be floating point, got {t.dtype}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{s.input_name} holds NaN or Inf")
            out[s.name] = t.to(device=device, dtype=dtype)
        else:
            if t.dtype.is_floating_point or t.dtype == torch.bool:
                raise ValueError(f"{s.input_name} must be int64, got {t.dtype}")
            if bool((t < 0).any()):
                raise ValueError(f"{s.input_name} must be >= 0, got {int(t.min())}")
            out[s.name] = t.reshape(b).to(device=device, dtype=torch.int64)
    return StepRequest(codes, out)


def group_by_frames(frames: Sequence[int]) -> "OrderedDict[int, List[int]]":
    """Indices grouped by their number of new frames, groups in order of first appearance."""
    groups: "OrderedDict[int, List[int]]" = OrderedDict()
    for i, t in enumerate(frames):
        groups.setdefault(int(t), []).append(i)
    return groups


def run_batch(requests: Sequence[StepRequest], sd, device=None, dtype=None,
              max_batch: Optional[int] = None) -> List[StepResult]:
    """Decode the new frames of every request with as few ``sd.step`` calls as possible.

    ``sd``: a :class:`StatefulCodecDecoder` (``state_names``, ``init_state``, ``step``). Requests are
    grouped by ``T``; a group's rows run in slices of at most ``max_batch`` rows. The state
    returned per request is contiguous, ``pos`` shaped ``[b, 1]``.
    """
    import torch

    names = sd.state_names()
    results: List[Optional[StepResult]] = [None] * len(requests)
    for t, idx in group_by_frames([r.frames for r in requests]).items():
        # row-level list (request index, row within request)
        rows = [(i, j) for i in idx for j in range(requests[i].rows)]
        step = max_batch or len(rows)
        audio_rows: Dict[Tuple[int, int], Any] = {}
        state_rows: Dict[Tuple[int, int], Dict[str, Any]] = {}
        for s in range(0, len(rows), step):
            part = rows[s:s + step]
            codes = torch.cat([requests[i].codes[j:j + 1] for i, j in part])
            zero = None
            parts: Dict[str, List[Any]] = {n: [] for n in names}
            for i, j in part:
                st = requests[i].state
                if st is None:
                    if zero is None:
                        zero = sd.init_state(1, device, dtype)
                    st_row = zero
                    for n in names:
                        parts[n].append(st_row[n])
                else:
                    for n in names:
                        parts[n].append(st[n][j:j + 1])
            state = OrderedDict((n, torch.cat(parts[n])) for n in names)
            with torch.inference_mode():
                audio, new = sd.step(codes, state)
            if audio.dim() != 2 or audio.shape[0] != len(part) or audio.shape[1] % t:
                raise RuntimeError(f"decoder returned audio {list(audio.shape)} for {len(part)} rows of {t} frames")
            for k, key in enumerate(part):
                audio_rows[key] = audio[k:k + 1]
                state_rows[key] = {n: new[n][k:k + 1] for n in names}
        for i in idx:
            keys = [(i, j) for j in range(requests[i].rows)]
            a = torch.cat([audio_rows[k] for k in keys]).float().contiguous()
            st = OrderedDict()
            for n in names:
                v = torch.cat([state_rows[k][n] for k in keys])
                if n == POS_NAME:
                    v = v.reshape(-1, 1)
                st[n] = v.contiguous()
            results[i] = StepResult(a, st)
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# The tts side: codec sessions


class LiveCounter:
    """Thread-safe count of live codec states; ``on_change(n)`` after every change (gauge hook)."""

    def __init__(self, on_change: Callable[[int], None] = lambda n: None):
        self._n = 0
        self._lock = threading.Lock()
        self.on_change = on_change

    @property
    def value(self) -> int:
        return self._n

    def add(self, d: int) -> None:
        with self._lock:
            self._n += d
            n = self._n
        self.on_change(n)


class WindowedSession:
    """Forwards to a windowed codec client (``decode(window, left_context)``); holds no state."""

    stateful = False

    def __init__(self, client):
        self.client = client

    async def decode(self, codes: np.ndarray, left_context: int) -> np.ndarray:
        return await self.client.decode(codes, left_context)

    def close(self) -> None:
        pass


# call(new_codes [T, 16], state or None) -> (audio [T * spf], new state); state is opaque here.
StepCall = Callable[[np.ndarray, Optional[Any]], Awaitable[Tuple[np.ndarray, Any]]]


class StatefulSession:
    """One stream's codec state between chunks. ``decode`` sends only the new frames
    (``codes[left_context:]``: with the stateful schedule ``left_context`` is 0) and keeps the
    returned state for the next chunk. ``close()`` drops the state (idempotent)."""

    stateful = True

    def __init__(self, call: StepCall, counter: Optional[LiveCounter] = None):
        self.call = call
        self.counter = counter
        self.state: Optional[Any] = None
        self.frames = 0
        self.closed = False
        self._counted = False

    async def decode(self, codes: np.ndarray, left_context: int) -> np.ndarray:
        if self.closed:
            raise RuntimeError("codec session is closed")
        new = np.asarray(codes)[left_context:]
        if new.shape[0] == 0:
            return np.zeros(0, np.float32)
        if not self._counted and self.counter is not None:
            self._counted = True
            self.counter.add(1)
        audio, state = await self.call(new, self.state)
        if self.closed:  # closed while the call was in flight: do not resurrect the state
            return audio
        self.state = state
        self.frames += new.shape[0]
        return audio

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.state = None
        if self._counted and self.counter is not None:
            self.counter.add(-1)


def open_session(codec):
    """``codec.session()`` when the client has one, else a :class:`WindowedSession` around it."""
    make = getattr(codec, "session", None)
    return make() if callable(make) else WindowedSession(codec)
