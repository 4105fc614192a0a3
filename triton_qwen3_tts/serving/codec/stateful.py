"""Serving the stateful codec: the state tensors' specs and the batching logic of
``codec_decoder_stateful``. No Triton import here; torch only where tensors are stacked.

Triton stays stateless: a stream's decoder state travels with each request as explicit
``state_in_<name>`` inputs and comes back as ``state_out_<name>`` outputs
(:class:`~triton_qwen3_tts.model.stateful_codec.StatefulCodecDecoder`, docs/design/stateful-codec.md).
The codec model therefore batches requests of different streams dynamically:

* :func:`run_batch` groups the requests of one ``execute`` by their number of new frames ``T``
  (one ``step`` needs the same ``T`` for all rows; rows may be at different positions), stacks each
  group's states along the batch axis (all-zero rows for a stream's first chunk), runs one ``step``
  per group (slices of at most ``max_batch`` rows), and splits audio and new states back per request.
* :func:`parse_request` validates one request's tensors (``ValueError`` with a clear message, the
  adapter answers INVALID_ARG).

**Resident state** (codec parameter ``state: resident``): the state never leaves the codec model.
Passing it as request tensors costs 38 tensors (2.6 MB in bf16) into and out of the model per
chunk, and on the H100 that transfer cost more than the recomputation it saves (docs/benchmarks.md,
run 5). In resident mode a request carries only ``stream_id`` (uint64), ``start`` / ``end`` flags and
its new frames; :class:`StatePool` keeps every live stream's state in one preallocated slot table
on the model's device (one flat row per stream, so a batch gathers and scatters its rows with one
kernel each), and :func:`run_resident_batch` opens, steps and releases streams per request
(:func:`parse_resident_request` validates). A stream is released by its ``end`` request (the tts
sends one from its session's ``aclose()`` on end, error and cancel) or, if its caller vanished,
after ``idle_timeout_s`` without a request. Resident state lives in one model instance, so the
model refuses to load with more than one.
The tts side of a stream is :mod:`triton_qwen3_tts.serving.tts.codec_session`.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from triton_qwen3_tts.serving.codec.graphs import POS_NAME, flat_state_layout, flat_state_views
from triton_qwen3_tts.serving.faults import Unavailable

NUM_QUANTIZERS = 16

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

    from triton_qwen3_tts.model.codec import CodecDecoder
    from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
    from triton_qwen3_tts.model.config import SpeechTokenizerConfig

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


def check_codes_values(codes, codebook_size: int, max_frames: Optional[int]) -> None:
    """Integer dtype, at most ``max_frames`` new frames (dim 1), values in ``[0, codebook_size)``
    (``audio_codes`` of either state mode; shapes are checked by the callers)."""
    import torch

    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise ValueError(f"audio_codes must be integers, got {codes.dtype}")
    if max_frames is not None and codes.shape[1] > max_frames:
        raise ValueError(f"audio_codes has {codes.shape[1]} new frames; the limit is {max_frames}")
    lo, hi = int(codes.min()), int(codes.max())
    if lo < 0 or hi >= codebook_size:
        raise ValueError(f"audio_codes values must be in [0, {codebook_size}), got [{lo}, {hi}]")


def parse_request(
    codes,
    start: Optional[bool],
    states: Mapping[str, Any],
    specs: Sequence[StateSpec],
    codebook_size: int = 2048,
    max_frames: Optional[int] = None,
    device=None,
    dtype=None,
) -> StepRequest:
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
    check_codes_values(codes, codebook_size, max_frames)
    codes = codes.to(device=device, dtype=torch.int64)
    known = {s.input_name for s in specs}
    unknown = sorted(set(states) - known)
    if unknown:
        raise ValueError(f"unknown state input(s) {unknown}")
    if start is None:
        start = not states
    if start:
        if states:
            raise ValueError(
                f"start=true takes no state_in_* inputs (the codec starts from zero state); got {sorted(states)}"
            )
        return StepRequest(codes, None)
    missing = [s.input_name for s in specs if s.input_name not in states]
    if missing:
        raise ValueError(
            f"missing state input(s) {missing}: send every state_out_* of the previous chunk "
            f"as state_in_*, or start=true on a stream's first chunk"
        )
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


def run_batch(
    requests: Sequence[StepRequest], sd, device=None, dtype=None, max_batch: Optional[int] = None
) -> List[StepResult]:
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
            part = rows[s : s + step]
            codes = torch.cat([requests[i].codes[j : j + 1] for i, j in part])
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
                        parts[n].append(st[n][j : j + 1])
            state = OrderedDict((n, torch.cat(parts[n])) for n in names)
            with torch.inference_mode():
                audio, new = sd.step(codes, state)
            if audio.dim() != 2 or audio.shape[0] != len(part) or audio.shape[1] % t:
                raise RuntimeError(f"decoder returned audio {list(audio.shape)} for {len(part)} rows of {t} frames")
            for k, key in enumerate(part):
                audio_rows[key] = audio[k : k + 1]
                state_rows[key] = {n: new[n][k : k + 1] for n in names}
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
# Resident state: the codec model keeps each stream's state, keyed by stream id


class StateCapacityError(Unavailable):
    """Every state slot is taken (the adapter answers UNAVAILABLE)."""


def new_stream_id() -> int:
    """A random 63-bit stream id (unique across tts instances with overwhelming probability)."""
    return secrets.randbits(63)


def to_device_async(t, device):
    """A CPU tensor on ``device`` without blocking the host: a pageable host-to-device copy waits
    for the device's queue, and with the GPU time-sliced between the talker's and the codec's
    processes every such wait costs about a time slice (scripts/gpu_share_probe.py). The copy
    goes through pinned memory (PyTorch keeps it alive until the copy is done)."""
    import torch

    device = torch.device(device) if device is not None else t.device
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class StatePool:
    """Live streams' decoder states in preallocated slots on one device.

    Float state of all streams is ONE tensor ``[capacity, F]`` (each name a fixed column range,
    in ``sd.state_names()`` order) and ``pos`` one int64 ``[capacity]``, so :meth:`gather` and
    :meth:`scatter` move a batch's rows with one kernel each instead of one per state tensor.
    :meth:`gather` returns per-name views ``[b, *shape]`` of the gathered rows (the step reads
    them; they are not contiguous across names). Not thread-safe: one model instance, one caller.

    ``idle_timeout_s``: :meth:`expire` releases streams without a request for that long (a tts
    that died mid-stream never sends ``end``). ``clock``: injectable for tests.
    """

    def __init__(
        self,
        sd,
        capacity: int,
        device=None,
        dtype=None,
        idle_timeout_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        import torch

        if capacity < 1:
            raise ValueError(f"state pool capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.idle_timeout_s = float(idle_timeout_s)
        self.clock = clock
        # name -> (offset, numel, shape): the graph runner's static buffers have the same layout
        self.names, self.layout, self.row_numel = flat_state_layout(sd)
        self.float_names = [n for n in self.names if n != POS_NAME]
        self.buf = torch.zeros((self.capacity, self.row_numel), device=device, dtype=dtype or torch.float32)
        self.pos = torch.zeros((self.capacity,), device=device, dtype=torch.int64)
        self._free = list(range(self.capacity - 1, -1, -1))  # pop() gives slot 0 first
        self._slots: Dict[int, int] = {}  # stream id -> slot
        self._last: Dict[int, float] = {}  # stream id -> time of its last request
        self.expired_total = 0

    @property
    def live(self) -> int:
        return len(self._slots)

    def __contains__(self, stream_id: int) -> bool:
        return stream_id in self._slots

    def open(self, stream_id: int) -> int:
        """A zeroed slot for a new stream (position 0)."""
        if stream_id in self._slots:
            raise ValueError(f"stream_id {stream_id} is already open: start=true only on a stream's first chunk")
        if not self._free:
            raise StateCapacityError(
                f"all {self.capacity} codec state slots are in use (state_slots); retry when streams end"
            )
        slot = self._free.pop()
        self.buf[slot].zero_()
        # a kernel, like the line above: ``pos[slot] = 0`` would wait for the whole stream (a
        # Python value set into one element of a CUDA tensor is a blocking host-to-device copy,
        # https://github.com/pytorch/pytorch/pull/186482), in the fused pipeline the talker step
        # the engine launched before this call
        self.pos[slot : slot + 1].zero_()
        self._slots[stream_id] = slot
        self._last[stream_id] = self.clock()
        return slot

    def slot(self, stream_id: int) -> int:
        slot = self._slots.get(stream_id)
        if slot is None:
            raise ValueError(
                f"unknown stream_id {stream_id}: not started with start=true, already ended, or "
                f"released after {self.idle_timeout_s:g} s without a request"
            )
        self._last[stream_id] = self.clock()
        return slot

    def release(self, stream_id: int) -> bool:
        """Free the stream's slot; False if it was not open (idempotent)."""
        slot = self._slots.pop(stream_id, None)
        self._last.pop(stream_id, None)
        if slot is None:
            return False
        self._free.append(slot)
        return True

    def expire(self) -> List[int]:
        """Release the streams idle for more than ``idle_timeout_s``; their ids."""
        if self.idle_timeout_s <= 0:
            return []
        limit = self.clock() - self.idle_timeout_s
        gone = [sid for sid, t in self._last.items() if t < limit]
        for sid in gone:
            self.release(sid)
        self.expired_total += len(gone)
        return gone

    def index(self, slots: Sequence[int]):
        """The slots as an int64 index tensor on the pool's device (no host sync)."""
        import torch

        return to_device_async(torch.tensor(list(slots), dtype=torch.int64), self.buf.device)

    def gather(self, slots: Sequence[int], idx=None) -> "OrderedDict[str, Any]":
        """The state of these slots as ``name -> [b, *shape]`` (``pos`` ``[b]``), in name order.
        ``idx``: :meth:`index` of ``slots``, if the caller has it already."""
        idx = self.index(slots) if idx is None else idx
        return flat_state_views(self.buf.index_select(0, idx), self.pos.index_select(0, idx), self.names, self.layout)

    def scatter(self, slots: Sequence[int], state: Mapping[str, Any], idx=None) -> None:
        """Store a step's new state (``name -> [b, ...]``) into these slots."""
        import torch

        b = len(slots)
        idx = self.index(slots) if idx is None else idx
        flat = torch.cat([state[n].reshape(b, -1).to(self.buf.dtype) for n in self.float_names], dim=1)
        if flat.shape[1] != self.row_numel:
            raise RuntimeError(f"new state has {flat.shape[1]} values per row; the pool holds {self.row_numel}")
        self.buf.index_copy_(0, idx, flat)
        self.pos.index_copy_(0, idx, state[POS_NAME].reshape(b).to(torch.int64))


@dataclass
class ResidentRequest:
    """One validated resident-mode request: ``codes`` int64 ``[1, T, 16]`` (None: release only)."""

    stream_id: int
    codes: Any
    start: bool
    end: bool

    @property
    def frames(self) -> int:
        return 0 if self.codes is None else int(self.codes.shape[1])


def _flag(name: str, value) -> bool:
    import torch

    if value is None:
        return False
    t = torch.as_tensor(value).reshape(-1)
    if t.numel() != 1:
        raise ValueError(f"{name} must hold exactly one value, got {t.numel()}")
    return bool(t[0])


def parse_resident_request(
    codes, stream_id, start=None, end=None, codebook_size: int = 2048, max_frames: Optional[int] = None, device=None
) -> ResidentRequest:
    """Validate one resident-mode request (torch tensors or numpy arrays; ``codes`` may be None
    for a release: ``end=true`` without frames)."""
    import torch

    if stream_id is None:
        raise ValueError("stream_id is required (uint64, one per stream)")
    sid = np.asarray(stream_id).reshape(-1)
    if sid.size != 1:
        raise ValueError(f"stream_id must hold exactly one value, got {sid.size}")
    if sid.dtype.kind not in "ui":
        raise ValueError(f"stream_id must be an unsigned integer, got {sid.dtype}")
    if sid.dtype.kind == "i" and int(sid[0]) < 0:
        raise ValueError(f"stream_id must be >= 0, got {int(sid[0])}")
    s, e = _flag("start", start), _flag("end", end)
    if codes is None:
        if not e or s:
            raise ValueError("audio_codes is required, except in a release request (end=true, start absent or false)")
        return ResidentRequest(int(sid[0]), None, False, True)
    c = torch.as_tensor(codes)
    if c.dim() != 3 or c.shape[0] != 1 or c.shape[2] != NUM_QUANTIZERS or c.shape[1] < 1:
        raise ValueError(
            f"audio_codes must have shape [1, frames>=1, {NUM_QUANTIZERS}] (one stream per request), "
            f"got {list(c.shape)}"
        )
    check_codes_values(c, codebook_size, max_frames)
    return ResidentRequest(int(sid[0]), to_device_async(c.to(torch.int64), device), s, e)


def _check_audio(audio, rows: int, frames: int) -> None:
    """The decoder's audio is ``[rows, frames * samples per frame]``; else RuntimeError (before
    any state is stored: the streams' states stay where they were)."""
    if audio.dim() != 2 or audio.shape[0] != rows or audio.shape[1] % frames:
        raise RuntimeError(f"decoder returned audio {list(audio.shape)} for {rows} rows of {frames} frames")


def run_resident_batch(
    requests: Sequence[ResidentRequest],
    pool: StatePool,
    sd,
    max_batch: Optional[int] = None,
    defer_copy: bool = False,
) -> List[Any]:
    """Serve one batch of resident-mode requests against ``pool``.

    The only host sync is the audio's copy to the host at the end of each step call (indices and
    codes go to the device without one, :func:`to_device_async`). With ``defer_copy`` on a GPU
    there is none: the audio goes to pinned host memory behind the step calls, and the caller
    waits for the stream (an event recorded after this call) before reading it.

    Per request, in order: open (``start``) or look up its stream; decode the new frames of all
    requests in as few ``sd.step`` calls as possible (grouped by ``T``, slices of ``max_batch``
    rows; ``sd``: a :class:`StatefulCodecDecoder` or a ``StatefulGraphRunner``), storing the new
    states back; then release the streams whose request has ``end``. Returns, per request, its
    audio (float32 ``[T * spf]``, empty for a release) or the exception that failed it
    (``ValueError``: a bad stream id or flag sequence; :class:`StateCapacityError`; a decoder
    failure as ``RuntimeError``). One request's failure never fails another's.
    """
    import torch

    out: List[Any] = [None] * len(requests)
    slots: Dict[int, int] = {}  # request index -> slot, for the requests that decode
    refused = set()  # requests that failed before touching a state: they release nothing
    seen = set()
    for i, r in enumerate(requests):
        try:
            if r.stream_id in seen:
                raise ValueError(
                    f"stream_id {r.stream_id} has two requests in one batch: send a stream's next "
                    "chunk after the previous one's answer"
                )
            seen.add(r.stream_id)
            if r.codes is None:
                continue
            slots[i] = pool.open(r.stream_id) if r.start else pool.slot(r.stream_id)
        except (ValueError, StateCapacityError) as e:
            out[i] = e
            refused.add(i)
    keys = list(slots)
    for t, group in group_by_frames([requests[i].frames for i in keys]).items():
        members = [keys[k] for k in group]
        step = max_batch or len(members)
        for s0 in range(0, len(members), step):
            part = members[s0 : s0 + step]
            try:
                codes = torch.cat([requests[i].codes for i in part])
                rows = [slots[i] for i in part]
                idx = pool.index(rows)
                with torch.inference_mode():
                    if hasattr(sd, "step_pool"):  # a graph runner: the state moves in one copy each way
                        audio = sd.step_pool(codes, pool, rows, idx, check=_check_audio)
                    else:
                        audio, new = sd.step(codes, pool.gather(rows, idx))
                        _check_audio(audio, len(part), t)
                        pool.scatter(rows, new, idx)
                if defer_copy and audio.is_cuda:
                    host = torch.empty(audio.shape, dtype=torch.float32, pin_memory=True)
                    # converted on the GPU, then copied; ordered before the next call rewrites
                    # the runner's output buffer
                    audio = host.copy_(audio.float(), non_blocking=True)
                else:
                    audio = audio.float().cpu()
                for k, i in enumerate(part):
                    out[i] = audio[k]
            except Exception as e:  # noqa: BLE001 - a decoder failure fails these requests only
                for i in part:
                    out[i] = RuntimeError(f"stateful codec decode failed: {e}")
    for i, r in enumerate(requests):
        if r.end and i not in refused:  # ended, also when its decode failed
            pool.release(r.stream_id)
        if r.codes is None and out[i] is None:
            out[i] = torch.zeros(0, dtype=torch.float32)
    return out


# ---------------------------------------------------------------------------------------------
# The tts side: codec sessions
