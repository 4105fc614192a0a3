"""`talker`: decoupled Python model hosting the talker engine. Thin adapter around
triton_qwen3_tts.serving.talker.service.

The engine runs on its own event loop thread (as in triton-inference-server/vllm_backend), so
``execute`` returns at once and many requests stream concurrently. Two kinds of request:
a synthesis request (``text`` ...) streams ``codes [n, 16]`` (pipeline split) or ``audio [n]``
chunks (pipeline fused: the engine decodes them, ``serving/talker/fused.py``); an abort request
(``abort_request_id``) aborts a live synthesis (the tts BLS uses it on client cancel, because
Triton 2.51's BLS iterator cannot be cancelled).
"""

import os
import asyncio
import json
import threading
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from triton_qwen3_tts.serving import profiling
from triton_qwen3_tts.serving.stub import prepare_process
from triton_qwen3_tts.serving.errors import triton_error
from triton_qwen3_tts.serving.model_config import TalkerModelConfig, parameters_from_model_config
from triton_qwen3_tts.serving.talker.engines import make_engine, make_frontend
from triton_qwen3_tts.serving.talker.service import TALKER_INPUTS, TalkerService

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the runner our plugin is tested on (vLLM is imported later)

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error(err):
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))


class TritonPythonModel:
    def initialize(self, args):
        prepare_process()
        profiling.maybe_start("talker")  # QWEN3_TTS_PROFILE_DIR set: stack samples (diagnostics)
        self.cfg = TalkerModelConfig.from_parameters(parameters_from_model_config(json.loads(args["model_config"])))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="talker-loop", daemon=True)
        self.thread.start()
        frontend = make_frontend(self.cfg)
        engine = asyncio.run_coroutine_threadsafe(make_engine(self.cfg), self.loop).result()
        self.service = TalkerService(frontend, engine)
        if self.cfg.warmup:  # readiness means the engine has served a request
            asyncio.run_coroutine_threadsafe(self._warmup(), self.loop).result()
        self._init_metrics()

    def _init_metrics(self):
        M = pb_utils.MetricFamily
        self._families = {
            "aborted": M(
                name="qwen3_tts_talker_aborted_total",
                description="Talker engine requests aborted (cancel, error, abort request)",
                kind=M.COUNTER,
            ),
            "responses": M(
                name="qwen3_tts_talker_responses_total",
                description="Talker responses carrying frames (one per tts chunk "
                "when the caller sends response_frames)",
                kind=M.COUNTER,
            ),
        }
        self._responses = self._families["responses"].Metric(labels={"model": "talker"})
        self._fused = None
        if self.cfg.pipeline == "fused":
            self._init_fused_metrics()
        self._metric = self._families["aborted"].Metric(labels={"model": "talker"})
        self._aborted_seen = 0
        self._responses_seen = self.service.stats.responses  # not the warm-up's

    def _init_fused_metrics(self):
        from triton_qwen3_tts.serving.talker.fused import BATCH_BUCKETS, LAG_BUCKETS, SLACK_BUCKETS

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
        }
        self._fused = {}
        for key, (name, desc, buckets) in hists.items():
            fam = M(name=name, description=desc, kind=M.HISTOGRAM)
            self._families[name] = fam
            self._fused[key] = fam.Metric(labels={"model": "talker"}, buckets=list(buckets))
        fam = M(
            name="qwen3_tts_fused_deadline_misses_total",
            description="Chunks sent after the client's buffer ran dry (server-side underruns)",
            kind=M.COUNTER,
        )
        self._families["misses"] = fam
        self._fused_misses = fam.Metric(labels={"model": "talker"})
        st = self.service.engine.fused_stats  # not the warm-up's
        st.unexported.clear()
        self._fused_misses_seen = st.misses
        # Exported by a thread of its own, once a second: each observe() is an IPC to the stub's
        # parent, and on the event loop thread they delayed the engine's loop (hundreds per second
        # under load).
        self._fused_stop = threading.Event()
        self._fused_thread = threading.Thread(target=self._export_fused, name="talker-metrics", daemon=True)
        self._fused_thread.start()

    def _export_fused(self):
        n = 0
        while not self._fused_stop.wait(1.0):
            n += 1
            try:
                self._update_fused_metrics()
                if n % 30 == 0:  # the scheduler's counters in the server log, twice a minute
                    pb_utils.Logger.log_info(f"talker fused pipeline: {json.dumps(self.service.engine.stats())}")
            except Exception:  # noqa: BLE001 - metrics must not end the model
                pass

    def _update_fused_metrics(self):
        st = self.service.engine.fused_stats
        while st.unexported:
            key, value = st.unexported.popleft()
            self._fused[key].observe(value)
        if st.misses > self._fused_misses_seen:
            self._fused_misses.increment(st.misses - self._fused_misses_seen)
            self._fused_misses_seen = st.misses

    async def _warmup(self):
        inputs = {
            "text": np.array([b"warm up"], dtype=object),
            "max_frames": np.array([2], np.int32),
            "temperature": np.array([0.0], np.float32),
        }
        if self.service.frontend.config.task_type == "VoiceDesign":
            inputs["instruct"] = np.array([b"a calm voice"], dtype=object)
        if self.service.frontend.config.task_type == "Base":
            d = self.service.frontend.config.talker.hidden_size
            inputs["speaker_embedding"] = np.zeros(d, np.float32)
        async for _ in self.service.stream(f"warmup-{uuid.uuid4().hex[:8]}", inputs):
            pass

    def execute(self, requests):
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._serve(request), self.loop)
        return None

    async def _serve(self, request):
        sender = request.get_response_sender()
        try:
            ab = pb_utils.get_input_tensor_by_name(request, "abort_request_id")
            if ab is not None:
                await self.service.abort(ab.as_numpy().reshape(-1)[0].decode("utf-8"))
                sender.send(flags=_FINAL)
                return
            inputs = {}
            for name in list(TALKER_INPUTS) + ["ref_codes", "speaker_embedding", "response_frames"]:
                t = pb_utils.get_input_tensor_by_name(request, name)
                if t is not None:
                    inputs[name] = t.as_numpy()
            rid = request.request_id() or uuid.uuid4().hex
            # pipeline fused: the engine yields audio chunks (float32), split: frames
            name, dtype = ("audio", np.float32) if self.cfg.pipeline == "fused" else ("codes", np.int32)
            async for item in self.service.stream(rid, inputs):
                if request.is_cancelled():
                    break  # the generator's finally aborts the engine request
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(name, item.astype(dtype, copy=False))]))
            self._update_metrics()
            sender.send(flags=_FINAL)
        except asyncio.CancelledError:  # aborted through an abort request
            sender.send(_error(RuntimeError("aborted")), flags=_FINAL)
        except Exception as e:  # noqa: BLE001 - this request fails, the model stays up
            sender.send(_error(e), flags=_FINAL)
        finally:
            self._update_metrics()

    def _update_metrics(self):
        """Metrics once per request, not per response (each update is an IPC to the stub's parent);
        also called before a FINAL is sent, so a client that saw FINAL sees the counts."""
        st = self.service.stats
        if st.aborted > self._aborted_seen:
            self._metric.increment(st.aborted - self._aborted_seen)
            self._aborted_seen = st.aborted
        if st.responses > self._responses_seen:
            self._responses.increment(st.responses - self._responses_seen)
            self._responses_seen = st.responses

    def finalize(self):
        if self._fused is not None:
            self._fused_stop.set()
            self._fused_thread.join(timeout=5)
        try:
            self.service.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self._metric = None
            self._responses = None
            self._fused = None
            self._fused_misses = None
            self._families.clear()
            profiling.stop()
