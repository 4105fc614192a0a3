"""`tts`: decoupled Python BLS model. Thin adapter around triton_qwen3_tts.serving.tts.service.

Triton specifics live here and only here: reading inputs, BLS calls to `talker` (decoupled) and
`codec_decoder` (async, so concurrent streams batch there), response senders, custom metrics.
With ``pipeline fused`` there are no BLS calls: this model starts the native talker engine, with
the codec in its loop, on its own event loop (``_start_engine``) and streams its audio.

``gpus N`` (serving/tts/router.py): N lanes, one per GPU. Split: the BLS clients of ``talker_i`` and
``codec_decoder_i`` (or ``codec_decoder_stateful_i``) per lane; fused: one engine per device
``cuda:i`` (on cpu: N engines on the host), each on an event loop of its own. Metrics carry a
``gpu`` label where they are per lane.
"""

import asyncio
import collections
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from triton_qwen3_tts.model.checkpoint import load_generation_defaults
from triton_qwen3_tts.serving import profiling
from triton_qwen3_tts.serving.stub import freeze_heap, prepare_process, thaw_heap
from triton_qwen3_tts.serving.stub_procs import StubWatch
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.model_config import ENGINE_PREFIX, TtsModelConfig, parameters_from_model_config
from triton_qwen3_tts.serving.tts.pipeline import trim_window
from triton_qwen3_tts.serving.tts.request import TTS_INPUTS
from triton_qwen3_tts.serving.tts.service import SAMPLE_RATE, Metrics, TtsService
from triton_qwen3_tts.serving.codec.batch import bucket
from triton_qwen3_tts.serving.errors import downstream_error, triton_error
from triton_qwen3_tts.serving.codec.stateful import state_specs_from_checkpoint, zero_state_inputs
from triton_qwen3_tts.serving.tts.codec_session import ResidentSession, StatefulSession
from triton_qwen3_tts.serving.tts.router import lane_model_names, parse_gpus, resolve_devices


def tensors_from_dict(d):
    return [pb_utils.Tensor(name, value) for name, value in d.items()]


class _TalkerBLS:
    """Streams the talker's frames through a decoupled BLS call.

    The BLS response iterator blocks, so each live stream holds a thread while it waits for the
    talker. The threads come from a pool of their own, sized for every admitted stream plus
    aborts: asyncio's default executor (min(32, cpus + 4) threads) would let at most that many
    streams wait at once and queue the rest behind them.

    Iterator lifetime (the tts stub's segfault under load, docs/design/serving.md): a Triton 2.51
    ``ResponseIterator`` keeps every response it received, and once it has returned its FINAL
    response it queues a clean-up message; the stub's C++ thread that sends it erases the iterator
    from a map. If Python had already dropped the iterator, that erase destroys it and its
    responses' numpy arrays on the C++ thread without the GIL, and the stub dies. So an iterator
    that returned its FINAL is kept for ``ITERATOR_GRACE_S`` afterwards: the clean-up thread lets
    go first, and Python's drop, with the GIL, is the last. One whose reader stopped early
    (cancel, error) is read to its FINAL (the talker ends it after the abort) by a thread of its
    own, then held the same way: left unread, the stub never cleans it up, and Triton then kept
    the tts model live at shutdown until its exit timeout. Not the pool: reads of the abort
    request's own iterator queue there."""

    ITERATOR_GRACE_S = 10.0

    def __init__(self, model_name: str, max_streams: int):
        self.model_name = model_name
        self.pool = ThreadPoolExecutor(max_workers=max_streams + 8, thread_name_prefix="tts-bls")
        self._finished = collections.deque()  # (time, iterator): past their FINAL, held for the grace

    def _hold(self, it):
        """Keep a finished iterator for the grace period; drop older ones (event loop thread)."""
        now = time.monotonic()
        self._finished.append((now, it))
        while now - self._finished[0][0] > self.ITERATOR_GRACE_S:
            self._finished.popleft()

    async def _read(self, it):
        """All responses of one BLS call, read off the event loop; ends after its FINAL."""
        loop = asyncio.get_running_loop()
        pending, finished = None, False
        try:
            while True:
                # The BLS response iterator blocks; advance it off the event loop.
                pending = self.pool.submit(next, it, None)
                resp = await asyncio.wrap_future(pending)
                pending = None
                if resp is None:
                    finished = True
                    return
                yield resp
        finally:
            if finished:
                self._hold(it)
            else:
                threading.Thread(
                    target=self._read_to_end, args=(it, pending, loop), daemon=True, name="tts-bls-drain"
                ).start()

    def _read_to_end(self, it, pending, loop):
        """The rest of an iterator whose reader stopped early, up to its FINAL; then hold it on
        the loop. ``pending``: a read of it still running in the pool (it may be the last)."""
        try:
            done = pending is not None and pending.result() is None
            while not done:
                done = next(it, None) is None
        except BaseException:  # noqa: BLE001 - a cancelled read or a dead talker: hold it anyway
            pass
        try:
            loop.call_soon_threadsafe(self._hold, it)
        except RuntimeError:  # the loop is closed (model unloading): nothing is left to race with
            pass

    async def stream(self, request_id, inputs):
        req = pb_utils.InferenceRequest(
            model_name=self.model_name,
            request_id=request_id,
            inputs=tensors_from_dict(inputs),
            requested_output_names=["codes"],
        )
        responses = self._read(await req.async_exec(decoupled=True))
        try:
            async for resp in responses:
                if resp.has_error():
                    # the talker's own code and field ("[INVALID_ARG] max_frames: ..." reaches the
                    # client as that, once): serving/errors.py parses the message back
                    raise downstream_error(self.model_name, resp.error(), pb_utils.TritonError)
                out = pb_utils.get_output_tensor_by_name(resp, "codes")
                if out is not None:
                    # Copy: the array must not depend on the lifetime of the BLS response's buffer
                    # (the pipeline keeps frames across chunks; a view crashed the stub once in CI).
                    codes = np.array(out.as_numpy())
                    if codes.size:
                        yield codes.reshape(-1, 16)
        finally:
            await responses.aclose()

    async def abort(self, request_id):
        # Triton 2.51's BLS response iterator has no cancel(); the talker takes an explicit abort.
        req = pb_utils.InferenceRequest(
            model_name=self.model_name,
            inputs=[pb_utils.Tensor("abort_request_id", np.array([request_id.encode()], dtype=object))],
            requested_output_names=["codes"],
        )
        responses = self._read(await req.async_exec(decoupled=True))
        try:
            async for _ in responses:
                pass
        finally:
            await responses.aclose()


class _CodecBLS:
    def __init__(self, model_name: str, frame_buckets):
        self.model_name = model_name
        self.frame_buckets = tuple(frame_buckets)

    async def decode(self, codes, left_context):
        n_new = codes.shape[0] - left_context
        t = bucket(codes.shape[0], self.frame_buckets)  # equal shapes batch in a TensorRT codec
        window = np.zeros((1, t, 16), np.int64)
        window[0, : codes.shape[0]] = codes
        req = pb_utils.InferenceRequest(
            model_name=self.model_name,
            requested_output_names=["audio_values"],
            inputs=[pb_utils.Tensor("audio_codes", window)],
        )
        resp = await req.async_exec()
        if resp.has_error():
            raise downstream_error(self.model_name, resp.error(), pb_utils.TritonError)
        audio = np.array(pb_utils.get_output_tensor_by_name(resp, "audio_values").as_numpy()[0])  # own the samples
        return trim_window(audio, left_context, num_frames=n_new)


def _keep(t):
    """A BLS output tensor kept past its response: a host copy, or a GPU torch copy (DLPack)."""
    if t.is_cpu():
        return np.array(t.as_numpy())
    import torch

    # device-side copy: the state must not depend on the lifetime of the BLS response's buffer
    return torch.from_dlpack(t.to_dlpack()).clone()


def _send(name, x):
    if isinstance(x, np.ndarray):
        return pb_utils.Tensor(name, x)
    import torch.utils.dlpack

    return pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(x))


class _StatefulCodecBLS:
    """Per-request sessions on `codec_decoder_stateful`: each chunk sends only its new frames plus
    the stream's state (none and start=true on the first chunk) and keeps the returned state.
    State stays on the GPU as DLPack tensors when the codec runs there."""

    def __init__(self, model_name: str, checkpoint: str, zero_start: bool = False):
        self.model_name = model_name
        self.specs = state_specs_from_checkpoint(checkpoint)
        self.outputs = ["audio_values"] + [s.output_name for s in self.specs]
        # a codec without optional inputs (TensorRT) gets an all-zero state instead of start=true
        self.zero_start = zero_state_inputs(self.specs) if zero_start else None

    def session(self):
        return StatefulSession(self.step)

    async def decode(self, codes, left_context):  # not used: the service opens sessions
        raise RuntimeError("the stateful codec needs a session (codec.session())")

    async def step(self, codes, state):
        inputs = [pb_utils.Tensor("audio_codes", np.ascontiguousarray(codes, dtype=np.int64)[None])]
        if state is None and self.zero_start is not None:
            inputs += [pb_utils.Tensor(name, z) for name, z in self.zero_start]
        elif state is None:
            inputs.append(pb_utils.Tensor("start", np.ones((1, 1), np.bool_)))
        else:
            inputs += [_send(s.input_name, state[s.name]) for s in self.specs]
        req = pb_utils.InferenceRequest(model_name=self.model_name, requested_output_names=self.outputs, inputs=inputs)
        resp = await req.async_exec()
        if resp.has_error():
            raise downstream_error(self.model_name, resp.error(), pb_utils.TritonError)
        audio = np.array(pb_utils.get_output_tensor_by_name(resp, "audio_values").as_numpy()[0])
        new = {s.name: _keep(pb_utils.get_output_tensor_by_name(resp, s.output_name)) for s in self.specs}
        return audio, new


class _ResidentCodecBLS:
    """Per-request sessions on a `codec_decoder_stateful` that keeps the state itself (state
    resident): each chunk sends its new frames and the stream id (start=true on the first); the
    session's aclose() sends the release (end=true, no frames)."""

    def __init__(self, model_name: str):
        self.model_name = model_name

    def session(self):
        return ResidentSession(self.step, self.release)

    async def decode(self, codes, left_context):  # not used: the service opens sessions
        raise RuntimeError("the stateful codec needs a session (codec.session())")

    async def _call(self, inputs, outputs):
        req = pb_utils.InferenceRequest(model_name=self.model_name, requested_output_names=outputs, inputs=inputs)
        resp = await req.async_exec()
        if resp.has_error():
            # its own code: UNAVAILABLE (every codec state slot taken) stays retryable
            raise downstream_error(self.model_name, resp.error(), pb_utils.TritonError)
        return resp

    async def step(self, codes, stream_id, start):
        inputs = [
            pb_utils.Tensor("audio_codes", np.ascontiguousarray(codes, dtype=np.int64)[None]),
            pb_utils.Tensor("stream_id", np.array([[stream_id]], np.uint64)),
        ]
        if start:
            inputs.append(pb_utils.Tensor("start", np.ones((1, 1), np.bool_)))
        resp = await self._call(inputs, ["audio_values"])
        return np.array(pb_utils.get_output_tensor_by_name(resp, "audio_values").as_numpy()[0])

    async def release(self, stream_id):
        await self._call(
            [
                pb_utils.Tensor("stream_id", np.array([[stream_id]], np.uint64)),
                pb_utils.Tensor("end", np.ones((1, 1), np.bool_)),
            ],
            ["audio_values"],
        )


class _Sender:
    """One request's response sender and cancel probe. After the FINAL response it lets go of
    the request and its sender at once: a reference cycle through an exception's traceback can
    keep this object alive until the next garbage collection, and while the stub still holds a
    request or its response sender, Triton counts the model as live and a server shutdown waits
    its full exit timeout for it."""

    def __init__(self, request):
        self.request = request
        self.sender = request.get_response_sender()

    def cancelled(self):
        return self.request is None or self.request.is_cancelled()

    def audio(self, samples, final, sample_rate=SAMPLE_RATE):
        sr = _SR if sample_rate == SAMPLE_RATE else np.array([sample_rate], np.int32)
        resp = pb_utils.InferenceResponse([pb_utils.Tensor("audio", samples), pb_utils.Tensor("sample_rate", sr)])
        self._send(resp, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def error(self, err):
        self._send(
            pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError)),
            pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def _send(self, resp, flags):
        if self.sender is None:
            raise RuntimeError("response after the final one")
        try:
            self.sender.send(resp, flags=flags)
        finally:
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.sender = self.request = None


_SR = np.array([SAMPLE_RATE], np.int32)


def _log_failure(fut):
    # handle() never raises by contract; if it ever does, the log must say so.
    exc = fut.exception()
    if exc is not None:
        pb_utils.Logger.log_error(f"tts: request handler failed: {exc!r}")


# The engine's cumulative device counters the fused pipeline exports: (its stats() key, the
# (seconds, count) families in _FusedMetrics.families, the label of their keys)
_DEVICE_COUNTERS = (
    ("gpu_ms", ("device_s", "device_n"), "kind"),
    ("gpu_gap_ms", ("gap_s", "gap_n"), "transition"),
)


class _FusedMetrics:
    """Pipeline fused: the scheduler's histograms and deadline misses
    (``serving/talker/fused.py`` FusedStats) and each engine's streams and decoded frames, labelled
    by ``gpu`` (one engine per lane), exported by a thread of their own once a second: each
    ``observe()`` is an IPC to the stub's parent, and on the event loop they would delay the
    engine (hundreds per second under load). The scheduler's counters go to the log twice a
    minute. The engine's device time per kind of launch (its ``gpu_ms``) becomes two counters
    labelled by ``kind``, and the GPU's gaps between its launches (its ``gpu_gap_ms``) two
    labelled by ``transition``, created as they appear: their differences between two scrapes
    split the device's time over any window, such as one benchmark level
    (``scripts/metrics_split.py --pairs``)."""

    def __init__(self, lanes):
        from triton_qwen3_tts.serving.talker.fused import (
            BATCH_BUCKETS,
            LAG_BUCKETS,
            REST_BUCKETS,
            SLACK_BUCKETS,
            WAIT_BUCKETS,
            device_time_increments,
        )

        self._device_time = device_time_increments

        M = pb_utils.MetricFamily
        hists = {
            "slack": (
                "qwen3_tts_fused_chunk_slack_seconds",
                "Client buffer (audio sent minus audio played since the first chunk) as each later "
                "chunk is sent; below 0: the chunk came late (an underrun)",
                SLACK_BUCKETS,
            ),
            "lag": (
                "qwen3_tts_fused_schedule_lag_seconds",
                "From a stream becoming ready to decode to its decode",
                LAG_BUCKETS,
            ),
            "batch": ("qwen3_tts_fused_codec_batch_size", "Streams per codec call", BATCH_BUCKETS),
            "first_frame": (
                "qwen3_tts_fused_first_frame_seconds",
                "From a stream's opening in the engine's process to its first frame (admission wait, "
                "prefill, first step)",
                WAIT_BUCKETS,
            ),
            "tail": (
                "qwen3_tts_fused_tail_seconds",
                "From a stream's last frame to its end (the decodes of its last chunks)",
                WAIT_BUCKETS,
            ),
            "rest": (
                "qwen3_tts_fused_rest_frames",
                "Frames a stream still had to decode when its last frame came (what its tail decodes)",
                REST_BUCKETS,
            ),
        }
        # per lane (GPU) its talker client, whose snapshot() is the lane's metrics
        # (serving/talker/service.py lane_snapshot: in this process or from a worker's)
        self.lanes = list(lanes)
        self.families, self.metrics = {}, {}
        for key, (name, desc, buckets) in hists.items():
            self.families[key] = M(name=name, description=desc, kind=M.HISTOGRAM)
        counters = {
            "misses": (
                "qwen3_tts_fused_deadline_misses_total",
                "Chunks sent after the client's buffer ran dry (server-side underruns)",
            ),
            "codec_frames": ("qwen3_tts_fused_codec_frames_total", "Frames the GPU's engine decoded to audio"),
            "streams": (
                "qwen3_tts_engine_streams_total",
                "Streams the GPU's talker engine started (state=started), finished or aborted",
            ),
        }
        for key, (name, desc) in counters.items():
            self.families[key] = M(name=name, description=desc, kind=M.COUNTER)
        self.families["states"] = M(
            name="qwen3_tts_fused_codec_states",
            description="Streams whose codec state the GPU's engine holds",
            kind=M.GAUGE,
        )
        device = {
            "device_s": (
                "qwen3_tts_fused_device_seconds_total",
                "Device time of the GPU's engine launches by kind (step_b<rows bucket>, prefill, "
                "codec_<reason>), from timing events around each launch",
            ),
            "device_n": ("qwen3_tts_fused_device_launches_total", "The GPU's engine launches by kind"),
            "gap_s": (
                "qwen3_tts_fused_device_gap_seconds_total",
                "The GPU's time between two of the engine's launches by transition (<group before>><group "
                "after>, groups step, codec, prefill; idle: gaps of 50 ms or more, no work queued)",
            ),
            "gap_n": ("qwen3_tts_fused_device_gaps_total", "Gaps between the GPU's engine launches by transition"),
        }
        for key, (name, desc) in device.items():
            self.families[key] = M(name=name, description=desc, kind=M.COUNTER)
        self.seen = {}  # (gpu, key) -> value exported so far
        # (gpu, stats key) -> {kind or transition: (ms, calls) exported}, per _DEVICE_COUNTERS entry
        self.device_seen = {(gpu, src): {} for gpu in range(len(self.lanes)) for src, _, _ in _DEVICE_COUNTERS}
        for gpu, lane in enumerate(self.lanes):
            labels = {"model": "tts", "gpu": str(gpu)}
            for key, (_, _, buckets) in hists.items():
                self.metrics[gpu, key] = self.families[key].Metric(labels=labels, buckets=list(buckets))
            self.metrics[gpu, "misses"] = self.families["misses"].Metric(labels=labels)
            self.metrics[gpu, "codec_frames"] = self.families["codec_frames"].Metric(labels=labels)
            self.metrics[gpu, "states"] = self.families["states"].Metric(labels=labels)
            for state in ("started", "finished", "aborted"):
                self.metrics[gpu, state] = self.families["streams"].Metric(labels={**labels, "state": state})
            snap = lane.snapshot()
            for key, value in snap["counts"].items():  # the warm-up's: not exported
                self.seen[gpu, key] = value
            for src, _, _ in _DEVICE_COUNTERS:  # the warm-up's: not exported
                self._device_time(snap["stats"].get(src, {}), self.device_seen[gpu, src])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tts-fused-metrics", daemon=True)
        self._thread.start()

    def _run(self):
        n = 0
        while not self._stop.wait(1.0):
            n += 1
            try:
                snaps = self.export()
                if n % 30 == 0:
                    for gpu, snap in enumerate(snaps):
                        pb_utils.Logger.log_info(f"tts fused pipeline gpu {gpu}: {json.dumps(snap['stats'])}")
            except Exception:  # noqa: BLE001 - metrics must not end the model
                pass

    def export(self):
        snaps = [lane.snapshot() for lane in self.lanes]
        for gpu, snap in enumerate(snaps):
            for key, value in snap["observations"]:
                self.metrics[gpu, key].observe(value)
            self.metrics[gpu, "states"].set(snap["live"])
            for key, value in snap["counts"].items():
                if value > self.seen[gpu, key]:
                    self.metrics[gpu, key].increment(value - self.seen[gpu, key])
                    self.seen[gpu, key] = value
            for src, (fs, fn), label in _DEVICE_COUNTERS:
                for key, seconds, calls in self._device_time(snap["stats"].get(src, {}), self.device_seen[gpu, src]):
                    for fam, value in ((fs, seconds), (fn, calls)):
                        m = self.metrics.get((gpu, fam, key))
                        if m is None:
                            labels = {"model": "tts", "gpu": str(gpu), label: key}
                            m = self.metrics[gpu, fam, key] = self.families[fam].Metric(labels=labels)
                        if value > 0:
                            m.increment(value)
        return snaps

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        self.metrics.clear()  # metrics before their families
        self.families.clear()


class TritonPythonModel:
    def initialize(self, args):
        prepare_process()
        profiling.maybe_start("tts")  # QWEN3_TTS_PROFILE_DIR set: stack samples (diagnostics)
        model_config = json.loads(args["model_config"])
        self._instance = args.get("model_instance_name", "tts_0")
        params = parameters_from_model_config(model_config)
        # pipeline fused: the talker engine runs in this process; its settings come prefixed
        # "talker." (serving/repository.py writes them from the talker model's template)
        engine_params = {k[len(ENGINE_PREFIX) :]: v for k, v in params.items() if k.startswith(ENGINE_PREFIX)}
        self.cfg = TtsModelConfig.from_parameters({k: v for k, v in params.items() if not k.startswith(ENGINE_PREFIX)})
        ckpt = Qwen3TTSConfig.from_file(os.path.join(self.cfg.checkpoint, "config.json"))
        self._init_metrics()
        # The service runs on its own event loop thread, so execute() returns at once (decoupled).
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tts-loop", daemon=True)
        self.thread.start()
        self.talkers, self.fused_metrics, self.talker_services, self.device_loops = [], None, [], []
        self.workers, self.peers = [], None
        fused = self.cfg.pipeline == "fused"
        if fused:  # no talker or codec model: the engine decodes the audio itself, here
            talker = self._start_engines(engine_params)
            codec = None
            peers = self.peers  # no sibling stub to watch; worker processes when there are any
        else:
            n = parse_gpus(self.cfg.gpus)  # the builder wrote one talker and codec model per GPU
            talker_names = lane_model_names(self.cfg.talker_model, n)
            codec_names = lane_model_names(self.cfg.codec_model, n)
            # the BLS threads are shared by every lane: the admission limits count all of them
            streams = n * self.cfg.max_in_flight + self.cfg.max_queued
            self.talkers = talker = [_TalkerBLS(name, streams) for name in talker_names]
            if self.cfg.codec_mode == "stateful" and self.cfg.codec_state == "resident":
                codec = [_ResidentCodecBLS(name) for name in codec_names]
            elif self.cfg.codec_mode == "stateful":
                codec = [
                    _StatefulCodecBLS(name, self.cfg.checkpoint, self.cfg.codec_zero_state_start)
                    for name in codec_names
                ]
            else:
                codec = [_CodecBLS(name, self.cfg.codec_frame_buckets) for name in codec_names]
            # the talker's and codec's stub processes: siblings of this one (children of tritonserver)
            peers = StubWatch(os.getppid(), tuple(talker_names + codec_names))
        self.encoders = None
        if ckpt.task_type == "Base":  # voice cloning: encoders next to the voice cache (serving.md)
            from triton_qwen3_tts.serving.tts.encoders import ReferenceEncoders

            runs = self._metrics
            self.encoders = ReferenceEncoders(
                self.cfg.checkpoint, self.cfg.encoder_device, on_run=lambda name: runs[f"enc_{name}"].increment(1)
            )
        self.service = TtsService(
            self.cfg,
            ckpt,
            talker,
            codec,
            self.metrics,
            encode=None if self.encoders is None else self.encoders.encode_async,
            peers=peers,
            generation=load_generation_defaults(self.cfg.checkpoint),
        )
        for gpu in range(len(self.service.lanes)):  # every lane's series from the start, at 0
            for key in ("frames", "infl", "routed"):
                self._lane_metric(key, gpu)
        self._watchdog = asyncio.run_coroutine_threadsafe(self.service.watchdog(), self.loop)
        freeze_heap()

    def _start_engines(self, engine_params):
        """Pipeline fused: start the native engine with the codec in its loop, one per device of
        the ``gpus`` setting, serve one warm-up request on each, and return their talker clients.
        ``fused_workers`` process: each engine in a worker process (``serving/talker/worker.py``),
        all loading at once. Thread: one device's engine runs on this model's event loop; several
        run each on a :class:`DeviceLoop` of its own (its threads' current CUDA device is the
        engine's)."""
        import dataclasses

        from triton_qwen3_tts.serving.model_config import TalkerModelConfig
        from triton_qwen3_tts.serving.talker.engines import make_engine, make_frontend
        from triton_qwen3_tts.serving.talker.service import DeviceLoop, LocalTalker, TalkerService
        from triton_qwen3_tts.serving.talker.worker import WorkerWatch, start_workers

        tcfg = TalkerModelConfig.from_parameters(engine_params)
        cuda = 0
        if tcfg.device != "cpu":
            import torch

            cuda = torch.cuda.device_count()
        devices = resolve_devices(self.cfg.gpus, tcfg.device, cuda)
        cfgs = [tcfg if len(devices) == 1 else dataclasses.replace(tcfg, device=d) for d in devices]
        if self.cfg.worker_processes(len(devices), devices[0]):
            names = [f"tts gpu {i} engine" for i in range(len(devices))]
            clients = start_workers(cfgs, names)
            for i, w in enumerate(clients):
                pb_utils.Logger.log_info(
                    f"tts: gpu {i}: native engine and codec on {w.info['device']} "
                    f"(worker process {w.process.pid}, ready in {w.info['load_s']} s)"
                )
            self.workers = clients
            self.peers = WorkerWatch(clients)
        else:
            if tcfg.device != "cpu":
                from triton_qwen3_tts.serving.talker.worker import set_engine_threads

                set_engine_threads(tcfg.engine_cpu_threads)
            frontend = make_frontend(tcfg)
            clients = []
            # one after the other: torch.compile is not safe to run in two threads of one process at once
            for i, (device, cfg_i) in enumerate(zip(devices, cfgs)):
                if len(devices) == 1:
                    loop, run = None, lambda coro: asyncio.run_coroutine_threadsafe(coro, self.loop).result()
                else:
                    dl = DeviceLoop(device, name=f"gpu{i}")
                    self.device_loops.append(dl)
                    loop, run = dl.loop, dl.run
                svc = TalkerService(frontend, run(make_engine(cfg_i)))
                if tcfg.warmup:  # readiness means every engine has served a request
                    run(svc.warmup())
                self.talker_services.append(svc)
                clients.append(LocalTalker(svc, loop))
                pb_utils.Logger.log_info(f"tts: gpu {i}: native engine and codec on {device}")
        self.fused_metrics = _FusedMetrics(clients)
        return clients

    def _init_metrics(self):
        # Families must outlive their metrics (the stub refuses updates otherwise): keep both.
        M = pb_utils.MetricFamily
        # one label set per instance: with tts_instances > 1 each stub reports its own series
        labels = {"model": "tts", "instance": self._instance}
        self._families = {
            "ttfa": M(
                name="qwen3_tts_time_to_first_audio_seconds",
                description="Time from request arrival to the first audio chunk",
                kind=M.HISTOGRAM,
            ),
            "ttff": M(
                name="qwen3_tts_time_to_first_frames_seconds",
                description="Time from request arrival to the talker's first frames (TTFA minus "
                "the first codec call and the send)",
                kind=M.HISTOGRAM,
            ),
            "frames": M(
                name="qwen3_tts_frames_total", description="Codec frames decoded (gpu: the lane)", kind=M.COUNTER
            ),
            "secs": M(name="qwen3_tts_audio_seconds_total", description="Audio seconds produced", kind=M.COUNTER),
            "infl": M(
                name="qwen3_tts_requests_in_flight",
                description="Requests being served (gpu: the lane serving them)",
                kind=M.GAUGE,
            ),
            "routed": M(
                name="qwen3_tts_requests_routed_total",
                description="Requests admitted onto each GPU's pipeline (gpus: the least-loaded one)",
                kind=M.COUNTER,
            ),
            "refused": M(
                name="qwen3_tts_requests_refused_total",
                description="Requests refused at the admission limit",
                kind=M.COUNTER,
            ),
            "cancelled": M(
                name="qwen3_tts_requests_cancelled_total",
                description="Requests cancelled by the client",
                kind=M.COUNTER,
            ),
            "states": M(
                name="qwen3_tts_codec_states_live", description="Streams holding stateful-codec state", kind=M.GAUGE
            ),
            "vhit": M(
                name="qwen3_tts_voice_cache_hits_total",
                description="Base requests whose voice_id was served from the voice cache (no encoder ran)",
                kind=M.COUNTER,
            ),
            "vmiss": M(
                name="qwen3_tts_voice_cache_misses_total",
                description="Base requests with a voice_id not served from the voice cache",
                kind=M.COUNTER,
            ),
            "vevict": M(
                name="qwen3_tts_voice_cache_evictions_total",
                description="Voices evicted from the voice cache (least recently used)",
                kind=M.COUNTER,
            ),
            "vsize": M(name="qwen3_tts_voice_cache_entries", description="Voices in the voice cache", kind=M.GAUGE),
            "enc": M(
                name="qwen3_tts_reference_encoder_runs_total",
                description="Reference encoder runs (encoder=speaker|codec)",
                kind=M.COUNTER,
            ),
            "failed": M(
                name="qwen3_tts_requests_failed_total",
                description="Requests the watchdog ended (reason=stalled: no progress for "
                "request_deadline_s; reason=peer_died: the talker or codec process died)",
                kind=M.COUNTER,
            ),
        }
        f = self._families
        self._metrics = {
            k: (
                f[k].Metric(labels=labels, buckets=[0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5])
                if k in ("ttfa", "ttff")
                else f[k].Metric(labels=labels)
            )
            for k in f
            if k not in ("enc", "failed", "frames", "infl", "routed")  # per lane: _lane_metric
        }
        self._labels = labels
        for name in ("speaker", "codec"):
            self._metrics[f"enc_{name}"] = f["enc"].Metric(labels={**labels, "encoder": name})
        for reason in ("stalled", "peer_died"):
            self._metrics[f"failed_{reason}"] = f["failed"].Metric(labels={**labels, "reason": reason})
        m = self._metrics
        # codec_call goes to the profiler only: a metric update per chunk is one more IPC per chunk
        self.metrics = Metrics(
            first_audio=m["ttfa"].observe,
            first_frames=m["ttff"].observe,
            codec_call=lambda s: profiling.timing("codec_call", s),
            audio_seconds=m["secs"].increment,
            device_frames=lambda gpu, n: self._lane_metric("frames", gpu).increment(n),
            device_in_flight=lambda gpu, n: self._lane_metric("infl", gpu).set(n),
            routed=lambda gpu: self._lane_metric("routed", gpu).increment(1),
            refused=lambda: m["refused"].increment(1),
            aborted=lambda: m["cancelled"].increment(1),
            codec_states_live=m["states"].set,
            voice_cache_hit=lambda: m["vhit"].increment(1),
            voice_cache_miss=lambda: m["vmiss"].increment(1),
            voice_cache_evicted=m["vevict"].increment,
            voice_cache_size=m["vsize"].set,
            failed=lambda reason: m[f"failed_{reason}"].increment(1),
        )

    def _lane_metric(self, key, gpu):
        """The series of per-lane metric ``key`` for lane ``gpu`` (made on first use)."""
        name = f"{key}_{gpu}"
        if name not in self._metrics:
            self._metrics[name] = self._families[key].Metric(labels={**self._labels, "gpu": str(gpu)})
        return self._metrics[name]

    def execute(self, requests):
        for request in requests:
            inputs = {}
            for name in TTS_INPUTS:
                t = pb_utils.get_input_tensor_by_name(request, name)
                if t is not None:
                    inputs[name] = np.array(t.as_numpy())  # owned: nothing pins the request's buffers
            send = _Sender(request)
            fut = asyncio.run_coroutine_threadsafe(self.service.handle(inputs, send, send.cancelled), self.loop)
            fut.add_done_callback(_log_failure)
        return None

    def finalize(self):
        # Every object that wraps a stub handle (senders, BLS requests and iterators, metrics)
        # must be gone before the stub tears itself down: one left for the interpreter's exit
        # garbage collection segfaulted the stub at every shutdown. So: cancel what still runs on
        # the loop, stop it, drop the service and collect now.
        async def drain():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        try:
            asyncio.run_coroutine_threadsafe(drain(), self.loop).result(timeout=5)
        except Exception as e:  # noqa: BLE001 - shut down regardless
            pb_utils.Logger.log_warn(f"tts: draining the event loop at unload: {e!r}")
        if self.fused_metrics is not None:
            self.fused_metrics.stop()
        for svc in self.talker_services:
            svc.engine.shutdown()
        for dl in self.device_loops:
            dl.close()
        for w in self.workers:
            w.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        for talker in self.talkers:
            talker.pool.shutdown(wait=False, cancel_futures=True)
        if self.encoders is not None:
            self.encoders.close()
        self.service = self.metrics = self._watchdog = self.fused_metrics = None
        self.talkers, self.talker_services, self.device_loops, self.workers = [], [], [], []
        self.peers = None
        self._metrics.clear()  # metrics before their families
        self._families.clear()
        thaw_heap()
        profiling.stop()
