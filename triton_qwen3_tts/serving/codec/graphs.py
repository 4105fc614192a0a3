"""CUDA graphs for the stateful codec step, behind ``codec_decoder_stateful``.

:class:`StatefulGraphRunner` wraps a :class:`~triton_qwen3_tts.model.stateful_codec.StatefulCodecDecoder`
and has the same ``step(codes, state) -> (audio, new_state)`` interface (plus ``state_names`` and
``init_state``), so :func:`~triton_qwen3_tts.serving.codec.stateful.run_batch` takes it in place of
the decoder. It keeps one CUDA graph per (batch bucket, T):

* ``T`` is an **exact** new-frame count from a configured list (``stateful_frame_buckets``). Frames
  are never padded: a padded frame would be decoded *into the state* (the KV cache, the conv
  histories and ``pos`` would advance past it). A ``T`` not in the list runs as consecutive graph
  steps of listed sizes (:func:`split_frames`; the same decode up to rounding, and always possible
  when 1 is listed); one
  that cannot be split, or more rows than the largest batch bucket, runs the eager ``sd.step``.
* Rows are padded up to the smallest batch bucket that fits, with zero codes and **zero state**
  (a fresh stream at position 0): rows are independent, so padding rows change no real row.
* Static buffers: per (bucket, T) the codes ``[bb, T, 16]``; the state input and the new-state
  output are ONE set of buffers of the largest bucket, each graph using the leading ``bb`` rows.
  Each set is one float tensor ``[largest bucket, F]`` (every float state a fixed column range,
  :func:`flat_state_layout`, the layout of the resident state pool) and ``pos`` ``[largest
  bucket]``; the graphs see per-name views of it. The graph's last kernels copy the new state into
  the output set, so the state outputs cost no memory per graph. :meth:`StatefulGraphRunner.step`
  copies its codes and state into the static inputs (zeroing the padding rows), replays, and
  **clones** the real rows of the audio and the new state out (the next replay of any graph
  overwrites the shared buffers). :meth:`StatefulGraphRunner.step_pool`, for states held in a
  :class:`~triton_qwen3_tts.serving.codec.stateful.StatePool` of the same layout, moves a batch's
  state with one gather into the input set and one scatter from the output set: a handful of
  kernel launches per call whatever the number of state tensors, instead of several per tensor.
* Graphs share one memory pool and are captured at warm-up (``warmup()``, from the model's
  ``initialize``), each after two eager runs on a side stream, as
  :class:`~triton_qwen3_tts.serving.codec.runtime.TorchCodec` does.

``capture=False`` runs exactly the same staging, padding and slicing but calls the padded step
eagerly instead of replaying a graph: it is how CPU tests check the padding logic, and a fallback
for debugging on the GPU.

Memory on the real decoder (fp32, 5.2 MB of state per row): the state buffers are
2 x 64 x 5.2 MB = 0.67 GB for a largest bucket of 64 (half in bf16), plus the graphs' pool.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from triton_qwen3_tts.serving.codec.batch import bucket

POS_NAME = "pos"  # the decoder's int64 position state (model/stateful_codec.py)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # as serving/codec/runtime.py's DEFAULT_BATCH_BUCKETS


def batch_buckets_for(max_batch: Optional[int], buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS) -> Tuple[int, ...]:
    """The batch buckets below ``max_batch`` plus ``max_batch`` itself (all of them when None)."""
    if max_batch is None:
        return tuple(buckets)
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return tuple(b for b in buckets if b < max_batch) + (int(max_batch),)


def graph_key(
    rows: int, frames: int, batch_buckets: Sequence[int], frame_buckets: Sequence[int]
) -> Optional[Tuple[int, int]]:
    """``(batch bucket, frames)`` of the graph that runs ``rows`` x ``frames``, or None (eager):
    frames must be one of ``frame_buckets`` exactly; rows at most the largest batch bucket."""
    if rows < 1 or frames not in tuple(frame_buckets) or not batch_buckets or rows > batch_buckets[-1]:
        return None
    return bucket(rows, batch_buckets), int(frames)


def flat_state_layout(sd) -> Tuple[List[str], "OrderedDict[str, Tuple[int, int, Tuple[int, ...]]]", int]:
    """How one row of a stateful decoder's float state lies in one flat tensor: ``(names,
    layout, row_numel)``, ``layout`` float name -> ``(offset, numel, shape)`` in ``state_names()``
    order, ``pos`` left out (it is int64, kept apart). The resident state pool and the graph
    runner's static buffers share it, so a batch's rows move between them in one copy."""
    import math

    shapes = sd.state_shapes(1)
    names = list(sd.state_names())
    layout: "OrderedDict[str, Tuple[int, int, Tuple[int, ...]]]" = OrderedDict()
    off = 0
    for n in names:
        if n == POS_NAME:
            continue
        shape = tuple(shapes[n][1:])
        numel = math.prod(shape)
        layout[n] = (off, numel, shape)
        off += numel
    return names, layout, off


def flat_state_views(flat, pos, names: Sequence[str], layout) -> "OrderedDict[str, object]":
    """Per-name views ``[rows, *shape]`` of a flat state ``flat`` ``[rows, F]`` and ``pos`` ``[rows]``."""
    rows = flat.shape[0]
    out: "OrderedDict[str, object]" = OrderedDict()
    for n in names:
        if n == POS_NAME:
            out[n] = pos
        else:
            off, numel, shape = layout[n]
            out[n] = flat[:, off : off + numel].view((rows,) + shape)
    return out


def split_frames(frames: int, frame_buckets: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """``frames`` as a sum of ``frame_buckets`` values, largest first (greedy), or None when the
    greedy split leaves a remainder (no bucket of 1) or ``frames`` is itself a bucket."""
    if frames in tuple(frame_buckets) or frames < 1:
        return None
    out, left = [], int(frames)
    for v in sorted(frame_buckets, reverse=True):
        while left >= v:
            out.append(int(v))
            left -= v
    return tuple(out) if left == 0 else None


def stage_rows(dst, src) -> None:
    """``dst[:b] = src`` and ``dst[b:] = 0`` (``b = src.shape[0]``), in place."""
    b = src.shape[0]
    if b > dst.shape[0] or tuple(src.shape[1:]) != tuple(dst.shape[1:]):
        raise ValueError(f"cannot stage {list(src.shape)} into {list(dst.shape)}")
    dst[:b].copy_(src)
    if b < dst.shape[0]:
        dst[b:].zero_()


def stage_state(dst: Mapping[str, object], state: Mapping[str, object], names: Sequence[str]) -> None:
    """Copy every state tensor into its static buffer, padding rows zeroed (zero state = a new stream)."""
    for n in names:
        stage_rows(dst[n], state[n])


def pad_state(state: Mapping[str, object], rows: int, names: Sequence[str]) -> "OrderedDict[str, object]":
    """A new state with ``rows`` rows: the given rows, then all-zero rows."""
    import torch

    out = OrderedDict()
    for n in names:
        t = state[n]
        buf = torch.zeros((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        stage_rows(buf, t)
        out[n] = buf
    return out


def slice_state(
    state: Mapping[str, object], rows: int, names: Sequence[str], clone: bool = True
) -> "OrderedDict[str, object]":
    """The first ``rows`` rows of every state tensor (cloned by default: the buffers are reused)."""
    return OrderedDict((n, state[n][:rows].clone() if clone else state[n][:rows]) for n in names)


def compile_step(step, backend: str = "inductor"):
    """``step(codes, state)`` through ``torch.compile`` with the batch and frame dims of the codes
    and the batch dim of the state dynamic, so one compiled graph serves every (batch bucket, T)
    slot with both at least 2: compiling each slot separately would cost minutes per slot at
    start. A batch or frame count of 1 would compile again (dynamo specialises sizes 0 and 1:
    on the H100 each compile of the 1.7B codec took 50-70 s), which is why
    :class:`StatefulGraphRunner` never calls it with one. Inductor fuses the decoder's elementwise work (SnakeBeta, the
    residual adds, the ConvNeXt norm and GELU) between the cuDNN convolutions; the slots' CUDA
    graphs then capture the compiled kernels. ``backend``: a ``torch.compile`` backend
    (``aot_eager`` traces without generating kernels: how CPU tests check the wiring)."""
    import torch
    import torch._dynamo

    compiled = torch.compile(step, backend=backend, dynamic=None)
    dc = torch._dynamo.config
    name = "recompile_limit" if hasattr(dc, "recompile_limit") else "cache_size_limit"

    def call(codes, state):
        if getattr(dc, name) < 64:
            setattr(dc, name, 64)
        torch._dynamo.maybe_mark_dynamic(codes, 0)
        torch._dynamo.maybe_mark_dynamic(codes, 1)
        for t in state.values():
            torch._dynamo.maybe_mark_dynamic(t, 0)
        return compiled(codes, state)

    return call


class _Slot:
    __slots__ = ("codes", "state_in", "state_out", "audio", "graph")

    def __init__(self, codes, state_in, state_out):
        self.codes, self.state_in, self.state_out = codes, state_in, state_out
        self.audio = None
        self.graph = None


class StatefulGraphRunner:
    """``step`` like ``StatefulCodecDecoder.step``, replaying a CUDA graph per (batch bucket, T)
    for T in ``frame_buckets`` (module docstring). ``capture=False``: the same padded path, eager."""

    def __init__(
        self,
        sd,
        device,
        dtype,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        frame_buckets: Sequence[int] = (1, 2, 4, 8, 16, 25),
        capture: bool = True,
        compile: bool = False,
        compile_backend: str = "inductor",
    ):
        import torch

        self.torch = torch
        self.sd = sd
        self.device = torch.device(device)
        self.dtype = dtype
        bb = tuple(int(b) for b in batch_buckets)
        fb = tuple(int(t) for t in frame_buckets)
        for name, vals in (("batch_buckets", bb), ("frame_buckets", fb)):
            if not vals or any(v < 1 for v in vals) or any(a >= b for a, b in zip(vals, vals[1:])):
                raise ValueError(f"{name} must be non-empty, strictly ascending ints >= 1, got {vals}")
        self.batch_buckets, self.frame_buckets = bb, fb
        self.capture = bool(capture)
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device; use capture=False (or the decoder itself) on CPU")
        self.names, self.layout, self.row_numel = flat_state_layout(sd)
        self.samples_per_frame = getattr(sd, "samples_per_frame", 1920)
        self._slots: Dict[Tuple[int, int], _Slot] = {}
        self._in = None  # name -> [max bucket, ...] static state input (views of _flat_in, _pos_in)
        self._out = None  # name -> [max bucket, ...] static new-state output (views of _flat_out, _pos_out)
        self._flat_in = self._pos_in = self._flat_out = self._pos_out = None
        self._pool = None
        self.compile = bool(compile)
        if self.compile:  # no batch of 1 reaches the compiled step: it pads into the 2-row slot
            self.batch_buckets = bb = tuple(sorted({max(2, b) for b in bb}))
        self._step = compile_step(sd.step, compile_backend) if self.compile else sd.step
        self.graph_calls = 0  # calls served by a (graph or capture=False padded) slot
        self.eager_calls = 0  # calls that fell back to sd.step
        self.split_calls = 0  # calls whose T ran as several graph steps (split_frames)

    # ---- the decoder's layout API (run_batch uses these) ------------------------------------

    def state_names(self):
        return list(self.names)

    def init_state(self, batch, device=None, dtype=None):
        return self.sd.init_state(
            batch, device if device is not None else self.device, dtype if dtype is not None else self.dtype
        )

    # ---- slots --------------------------------------------------------------------------------

    def _buffers(self):
        if self._in is None:
            torch = self.torch
            top = self.batch_buckets[-1]
            flat = lambda: torch.zeros((top, self.row_numel), device=self.device, dtype=self.dtype)  # noqa: E731
            pos = lambda: torch.zeros((top,), device=self.device, dtype=torch.int64)  # noqa: E731
            self._flat_in, self._pos_in, self._flat_out, self._pos_out = flat(), pos(), flat(), pos()
            self._in = flat_state_views(self._flat_in, self._pos_in, self.names, self.layout)
            self._out = flat_state_views(self._flat_out, self._pos_out, self.names, self.layout)
        return self._in, self._out

    def _body(self, slot: _Slot):
        # one frame: the decoder itself (compiling T = 1 too would double the start-up time;
        # single frames are a stream's rare remainders)
        step = self._step if slot.codes.shape[1] > 1 else self.sd.step
        audio, new = step(slot.codes, slot.state_in)
        for n in self.names:
            slot.state_out[n].copy_(new[n])
        return audio

    def _run(self, slot: _Slot):
        """Replay the slot's graph (capture=False: run its body eagerly); the slot's audio buffer."""
        if slot.graph is not None:
            slot.graph.replay()
        else:
            slot.audio = self._body(slot)
        return slot.audio

    def _slot(self, bb: int, t: int) -> _Slot:
        key = (bb, t)
        slot = self._slots.get(key)
        if slot is not None:
            return slot
        torch = self.torch
        with torch.inference_mode():
            ins, outs = self._buffers()
            codes = torch.zeros((bb, t, 16), dtype=torch.long, device=self.device)
            slot = _Slot(
                codes,
                OrderedDict((n, ins[n][:bb]) for n in self.names),
                OrderedDict((n, outs[n][:bb]) for n in self.names),
            )
            if self.capture:
                for n in self.names:  # a valid (zero) state for the warm-up and capture runs
                    slot.state_in[n].zero_()
                s = torch.cuda.Stream(self.device)
                s.wait_stream(torch.cuda.current_stream(self.device))
                # cuDNN times its algorithms for these shapes in the warm-up runs and the graph
                # keeps the fastest: its heuristic picks were up to 10x slower for the
                # channels-last bf16 convolutions (run 40c: 32 x 25 frames 581 ms against 63 for
                # the reference layout's eager step)
                tuned = torch.backends.cudnn.benchmark
                torch.backends.cudnn.benchmark = True
                try:
                    with torch.cuda.stream(s):
                        for _ in range(2):  # warm up kernels / allocator outside the graph
                            self._body(slot)
                    torch.cuda.current_stream(self.device).wait_stream(s)
                    g = torch.cuda.CUDAGraph()
                    if self._pool is None:
                        self._pool = torch.cuda.graph_pool_handle()
                    # on this device's stream, other threads free to use CUDA (engines/native/graphs.py)
                    with torch.cuda.graph(g, pool=self._pool, stream=s, capture_error_mode="thread_local"):
                        slot.audio = self._body(slot)
                finally:
                    torch.backends.cudnn.benchmark = tuned
                slot.graph = g
        self._slots[key] = slot
        return slot

    def warmup(self) -> None:
        """Capture every (batch bucket, T) graph now (capture=False: allocate the buffers), the
        largest first (with ``compile``: its one compile sees both dims dynamic)."""
        for bb in reversed(self.batch_buckets):
            for t in reversed(self.frame_buckets):
                self._slot(bb, t)

    @property
    def captured(self) -> Tuple[Tuple[int, int], ...]:
        return tuple(k for k, s in self._slots.items() if s.graph is not None)

    # ---- the step -----------------------------------------------------------------------------

    def step(self, codes, state):
        """``codes`` int64 ``[b, T, 16]``, ``state`` name -> ``[b, ...]`` (``pos`` ``[b]``) on the
        runner's device -> (audio ``[b, T*spf]``, new state), new tensors the caller owns.

        A ``T`` outside ``frame_buckets`` that :func:`split_frames` can write as a sum of them
        (always, when 1 is a bucket) runs as consecutive graph steps, e.g. a stream's last 20
        frames as 16 + 4: the same decode (stateful decoding is exact for any chunking), equal up
        to floating-point rounding (other kernel shapes); otherwise, and for more rows than the largest bucket, ``sd.step`` runs eagerly."""
        torch = self.torch
        b, t = int(codes.shape[0]), int(codes.shape[1])
        key = graph_key(b, t, self.batch_buckets, self.frame_buckets)
        pieces = split_frames(t, self.frame_buckets) if key is None and b <= self.batch_buckets[-1] else None
        if pieces:
            self.split_calls += 1
            audio, off = [], 0
            for n in pieces:
                a, state = self.step(codes[:, off : off + n], state)
                audio.append(a)
                off += n
            return torch.cat(audio, dim=1), state
        if key is None:
            self.eager_calls += 1
            with torch.inference_mode():
                return self.sd.step(codes, state)
        slot = self._slot(*key)
        with torch.inference_mode():
            stage_rows(slot.codes, codes)
            stage_state(slot.state_in, state, self.names)
            audio = self._run(slot)
            self.graph_calls += 1
            return audio[:b].clone(), slice_state(slot.state_out, b, self.names)

    def step_pool(self, codes, pool, rows: Sequence[int], idx, check=None):
        """:meth:`step` for streams whose state a :class:`~triton_qwen3_tts.serving.codec.stateful.StatePool`
        holds: reads the ``rows`` (slots; ``idx`` their :meth:`StatePool.index`), decodes
        ``codes`` ``[b, T, 16]`` and writes the new state back. Returns the audio ``[b, T*spf]``, a
        new tensor. On a graph slot and a pool of this runner's layout and dtype, the state moves
        with one gather into the static input and one scatter from the static output (and one of
        each for ``pos``); otherwise through :meth:`step` and the pool's gather and scatter.
        ``check(audio, rows, frames)``, if given, runs before the state is written back (it
        raises to leave the streams' states as they were)."""
        torch = self.torch
        b, t = int(codes.shape[0]), int(codes.shape[1])
        key = graph_key(b, t, self.batch_buckets, self.frame_buckets)
        if key is None or pool.row_numel != self.row_numel or pool.buf.dtype != self.dtype:
            audio, new = self.step(codes, pool.gather(rows, idx))
            if check is not None:
                check(audio, b, t)
            pool.scatter(rows, new, idx)
            return audio
        slot = self._slot(*key)
        with torch.inference_mode():
            stage_rows(slot.codes, codes)
            torch.index_select(pool.buf, 0, idx, out=self._flat_in[:b])
            torch.index_select(pool.pos, 0, idx, out=self._pos_in[:b])
            if b < key[0]:  # padding rows: zero state, a fresh stream
                self._flat_in[b : key[0]].zero_()
                self._pos_in[b : key[0]].zero_()
            audio = self._run(slot)
            if check is not None:
                check(audio[:b], b, t)
            pool.buf.index_copy_(0, idx, self._flat_out[:b])
            pool.pos.index_copy_(0, idx, self._pos_out[:b])
            self.graph_calls += 1
            return audio[:b].clone()


def warm_stateful_codec(
    sd,
    device,
    dtype,
    cuda_graphs: bool,
    max_batch: Optional[int],
    frame_buckets: Sequence[int],
    compile: bool = False,
) -> Optional["StatefulGraphRunner"]:
    """Make a stateful decoder ready to serve: on CUDA with ``cuda_graphs``, a
    :class:`StatefulGraphRunner` with every (batch bucket up to ``max_batch``, frame count in
    ``frame_buckets``) graph captured, so no request pays for a capture; otherwise None, after one
    eager warm-up step from zero state. Callers step the runner, or ``sd`` when it is None.
    ``compile`` (CUDA graphs only): the graphs capture the ``torch.compile``'d step
    (:func:`compile_step`). Each slot's capture lets cuDNN pick its convolutions' algorithms by
    timing them (``cudnn.benchmark``, :meth:`StatefulGraphRunner._slot`); on the H100 (1.7B
    codec, bf16, 32 streams x 25 frames, reference layout) that measured 2,036 audio-s/s
    compiled against 1,600 without it (docs/benchmarks.md)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and cuda_graphs:
        runner = StatefulGraphRunner(sd, device, dtype, batch_buckets_for(max_batch), frame_buckets, compile=compile)
        runner.warmup()
        torch.cuda.empty_cache()  # cuDNN's trial workspaces
        return runner
    with torch.inference_mode():
        sd.step(torch.zeros((1, 2, 16), dtype=torch.long, device=device), sd.init_state(1, device, dtype))
    return None
