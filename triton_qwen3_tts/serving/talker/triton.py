"""`talker`: decoupled Python model hosting the talker engine. Thin adapter around
triton_qwen3_tts.serving.talker.service.

The engine runs on its own event loop thread (as in triton-inference-server/vllm_backend), so
``execute`` returns at once and many requests stream concurrently. Two kinds of request:
a synthesis request (``text`` ...) streams ``codes [n, 16]``; an abort request
(``abort_request_id``) aborts a live synthesis (the tts BLS uses it on client cancel, because
Triton 2.51's BLS iterator cannot be cancelled). With ``pipeline fused`` there is no talker model:
the tts hosts the engine itself (``serving/tts/triton.py``).
"""

import os
import asyncio
import json
import threading
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from triton_qwen3_tts.serving import profiling
from triton_qwen3_tts.serving.stub import freeze_heap, pin_gpu, prepare_process, thaw_heap
from triton_qwen3_tts.serving.errors import triton_error
from triton_qwen3_tts.serving.model_config import TalkerModelConfig, parameters_from_model_config
from triton_qwen3_tts.serving.talker.engines import make_engine, make_frontend
from triton_qwen3_tts.serving.talker.worker import set_engine_threads
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
        pin_gpu(self.cfg.gpu)  # gpus > 1: this talker_i serves on GPU i only
        if self.cfg.device != "cpu":
            set_engine_threads(self.cfg.engine_cpu_threads)
        self._name = args.get("model_name", "talker")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="talker-loop", daemon=True)
        self.thread.start()
        frontend = make_frontend(self.cfg)
        engine = asyncio.run_coroutine_threadsafe(make_engine(self.cfg), self.loop).result()
        self.service = TalkerService(frontend, engine)
        if self.cfg.warmup:  # readiness means the engine has served a request
            asyncio.run_coroutine_threadsafe(self.service.warmup(), self.loop).result()
        self._init_metrics()
        freeze_heap()

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
        labels = {"model": self._name}  # gpus > 1: talker_0, talker_1, ... each its own series
        self._responses = self._families["responses"].Metric(labels=labels)
        self._metric = self._families["aborted"].Metric(labels=labels)
        self._aborted_seen = 0
        self._responses_seen = self.service.stats.responses  # not the warm-up's

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
            async for frames in self.service.stream(rid, inputs):
                if request.is_cancelled():
                    break  # the generator's finally aborts the engine request
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("codes", frames.astype(np.int32, copy=False))]))
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
        try:
            self.service.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self._metric = None
            self._responses = None
            self._families.clear()
            profiling.stop()
            thaw_heap()
