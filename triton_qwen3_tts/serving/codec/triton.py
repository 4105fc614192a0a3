"""The codec models' Triton layer: `codec_decoder` (Python variant) and `codec_decoder_stateful`.

:class:`CodecDecoderModel` (`codec_decoder`, Python variant): same name, inputs and outputs as the
TensorRT plan. Triton's dynamic batcher hands it a list of requests (ragged frames allowed);
:func:`~triton_qwen3_tts.serving.codec.batch.decode_batched` stacks them into one decode call and
splits the result.

:class:`StatefulCodecModel` (`codec_decoder_stateful`, Python backend): exact stateful decoding of
new frames (:mod:`triton_qwen3_tts.serving.codec.stateful`). Parameter `state`:

* `request`: read each request's `audio_codes` [b, T, 16], optional `start` and `state_in_*`
  tensors (DLPack, so GPU tensors stay on the GPU), validate them (INVALID_ARG per request), group
  the batch by T, run one StatefulCodecDecoder.step per group, and answer `audio_values` +
  `state_out_*` per request.
* `resident`: requests carry `stream_id`, `start` / `end` and `audio_codes` [1, T, 16] (none in a
  release); the state stays here, in a StatePool of `state_slots` slots (one instance only).
  Unknown or duplicate stream ids are INVALID_ARG, a full pool UNAVAILABLE. Gauge
  `qwen3_tts_codec_resident_states`: streams holding a slot.

On CUDA with cuda_graphs both run a CUDA-graph replay per (batch bucket, T) for T in
stateful_frame_buckets (:mod:`triton_qwen3_tts.serving.codec.graphs`).
"""

import json

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from triton_qwen3_tts.serving import profiling
from triton_qwen3_tts.serving.errors import InvalidInput, triton_error
from triton_qwen3_tts.serving.stub import freeze_heap, prepare_process, thaw_heap, use_instance_gpu
from triton_qwen3_tts.serving.codec.batch import check_codes, decode_batched
from triton_qwen3_tts.serving.codec.runtime import make_codec
from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder, torch_dtype
from triton_qwen3_tts.serving.model_config import CodecModelConfig, instance_count, parameters_from_model_config
from triton_qwen3_tts.serving.codec.stateful import (
    StatePool,
    parse_request,
    parse_resident_request,
    run_batch,
    run_resident_batch,
    state_specs,
)
from triton_qwen3_tts.serving.codec.graphs import warm_stateful_codec

_BACKEND_PARAMS = ("FORCE_CPU_ONLY_INPUT_TENSORS",)


def _torch(t):
    """A pb_utils.Tensor as a torch tensor (CPU or GPU) without a host round trip."""
    if t.is_cpu():
        return torch.from_numpy(np.array(t.as_numpy()))  # copy: the request's memory is not ours
    return torch.from_dlpack(t.to_dlpack())


def _out(name, x):
    if x.device.type == "cpu" and x.dtype != torch.bfloat16:
        return pb_utils.Tensor(name, x.numpy())
    return pb_utils.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(x))


def _error(err):
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))


def _parse_all(requests, parse):
    """(responses with INVALID_ARG where ``parse`` raised ValueError, indices parsed, parsed)."""
    responses = [None] * len(requests)
    good, parsed = [], []
    for i, req in enumerate(requests):
        try:
            parsed.append(parse(req))
            good.append(i)
        except ValueError as e:
            responses[i] = _error(InvalidInput(str(e)))
    return responses, good, parsed


class StatefulCodecModel:
    def initialize(self, args):
        prepare_process()
        profiling.maybe_start("codec_decoder_stateful")  # QWEN3_TTS_PROFILE_DIR set: stack samples (diagnostics)
        model_config = json.loads(args["model_config"])
        params = {k: v for k, v in parameters_from_model_config(model_config).items() if k not in _BACKEND_PARAMS}
        self.cfg = CodecModelConfig.from_parameters(params)
        use_instance_gpu(args)  # KIND_GPU: its GPU becomes "cuda" here (gpus > 1: the codec of GPU i)
        if self.cfg.runtime != "torch":
            raise ValueError("codec_decoder_stateful supports runtime torch only")
        self.max_batch = int(model_config.get("max_batch_size", 0)) or None
        self.resident = self.cfg.state == "resident"
        if self.resident:
            count = instance_count(model_config)
            if count != 1:
                raise ValueError(
                    f"state resident keeps each stream's state in one model instance; instance_group "
                    f"count must be 1, got {count}"
                )
        self.device = torch.device(self.cfg.device if self.cfg.device == "cpu" else "cuda")
        self.dtype = torch_dtype(self.cfg.dtype)
        decoder, st_cfg = load_codec_decoder(self.cfg.checkpoint, self.device, self.dtype)
        self.codebook_size = int(st_cfg.decoder.codebook_size)
        self.sd = StatefulCodecDecoder(
            decoder, channels_last=self.cfg.channels_last and self.device.type == "cuda"
        ).eval()
        self.specs = state_specs(self.sd)
        # CUDA graphs (GPU, cuda_graphs on): one per (batch bucket, exact T in stateful_frame_buckets),
        # all captured here; other T run as several graph steps (StatefulGraphRunner.step).
        self.runner = warm_stateful_codec(
            self.sd,
            self.device,
            self.dtype,
            self.cfg.cuda_graphs,
            self.max_batch,
            self.cfg.stateful_frame_buckets,
            compile=self.cfg.compile,
        )
        self.pool = None
        if self.resident:
            self.pool = StatePool(
                self.sd, self.cfg.state_slots, self.device, self.dtype, idle_timeout_s=self.cfg.state_idle_timeout_s
            )
            self._family = pb_utils.MetricFamily(
                name="qwen3_tts_codec_resident_states",
                kind=pb_utils.MetricFamily.GAUGE,
                description="Streams whose decoder state the stateful codec holds (state resident)",
            )
            self._live = self._family.Metric(labels={"model": args.get("model_name", "codec_decoder_stateful")})
        freeze_heap()

    def _parse(self, req):
        codes = pb_utils.get_input_tensor_by_name(req, "audio_codes")
        if codes is None:
            raise ValueError("audio_codes is required")
        start_t = pb_utils.get_input_tensor_by_name(req, "start")
        start = None
        if start_t is not None:
            s = _torch(start_t).reshape(-1)
            if s.numel() < 1 or not bool((s == s[0]).all()):
                raise ValueError("start must hold one value for the whole request")
            start = bool(s[0])
        states = {}
        for spec in self.specs:
            t = pb_utils.get_input_tensor_by_name(req, spec.input_name)
            if t is not None:
                states[spec.input_name] = _torch(t)
        return parse_request(
            _torch(codes),
            start,
            states,
            self.specs,
            codebook_size=self.codebook_size,
            max_frames=self.cfg.max_frames,
            device=self.device,
            dtype=self.dtype,
        )

    def _parse_resident(self, req):
        def get(name):
            t = pb_utils.get_input_tensor_by_name(req, name)
            return None if t is None else _torch(t)

        sid = pb_utils.get_input_tensor_by_name(req, "stream_id")
        return parse_resident_request(
            get("audio_codes"),
            None if sid is None else sid.as_numpy(),
            get("start"),
            get("end"),
            codebook_size=self.codebook_size,
            max_frames=self.cfg.max_frames,
            device=self.device,
        )

    def _execute_resident(self, requests):
        expired = self.pool.expire()
        if expired:
            pb_utils.Logger.log_warn(
                f"codec_decoder_stateful: released {len(expired)} stream state(s) idle for more "
                f"than {self.cfg.state_idle_timeout_s:g} s (their callers sent no end)"
            )
        responses, good, parsed = _parse_all(requests, self._parse_resident)
        results = run_resident_batch(parsed, self.pool, self.runner or self.sd, self.max_batch) if parsed else []
        for i, r in zip(good, results):
            if isinstance(r, Exception):
                # a bad stream id or flag: INVALID_ARG; a full state pool (StateCapacityError): UNAVAILABLE
                responses[i] = _error(InvalidInput(str(r)) if isinstance(r, ValueError) else r)
            else:
                responses[i] = pb_utils.InferenceResponse([_out("audio_values", r[None])])
        self._live.set(self.pool.live)
        return responses

    def execute(self, requests):
        if self.resident:
            return self._execute_resident(requests)
        responses, good, parsed = _parse_all(requests, self._parse)
        if parsed:
            try:
                results = run_batch(parsed, self.runner or self.sd, self.device, self.dtype, self.max_batch)
                for i, r in zip(good, results):
                    outs = [_out("audio_values", r.audio.cpu())]  # audio goes to the client anyway
                    outs += [_out(spec.output_name, r.state[spec.name]) for spec in self.specs]
                    responses[i] = pb_utils.InferenceResponse(outs)
            except Exception as e:  # a decoder failure fails this batch, not the server
                for i in good:
                    responses[i] = _error(RuntimeError(f"stateful codec decode failed: {e}"))
        return responses

    def finalize(self):
        if self.pool is not None:
            self._live = None  # the metric before its family
            self._family = None
            self.pool = None
        self.runner = None
        profiling.stop()
        self.sd = None
        thaw_heap()


class CodecDecoderModel:
    def initialize(self, args):
        prepare_process()
        profiling.maybe_start("codec_decoder")  # QWEN3_TTS_PROFILE_DIR set: stack samples (diagnostics)
        model_config = json.loads(args["model_config"])
        self.cfg = CodecModelConfig.from_parameters(parameters_from_model_config(model_config))
        use_instance_gpu(args)
        self.max_batch = int(model_config.get("max_batch_size", 0)) or None
        self.codec = make_codec(self.cfg)
        self.codec.warmup()
        self.spf = self.codec.samples_per_frame
        freeze_heap()

    def execute(self, requests):
        responses = [None] * len(requests)
        good, arrays = [], []
        for i, req in enumerate(requests):
            try:
                codes = pb_utils.get_input_tensor_by_name(req, "audio_codes").as_numpy()
                arrays.append(check_codes(codes, max_frames=self.cfg.max_frames))
                good.append(i)
            except ValueError as e:
                responses[i] = _error(InvalidInput(str(e)))
        if arrays:
            try:
                outs = decode_batched(arrays, self.codec.decode, self.spf, frame_buckets=None, max_batch=self.max_batch)
                for i, out in zip(good, outs):
                    responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("audio_values", out)])
            except Exception as e:  # a decoder failure fails this batch, not the server
                for i in good:
                    responses[i] = _error(RuntimeError(f"codec decode failed: {e}"))
        return responses

    def finalize(self):
        self.codec = None
        profiling.stop()
        thaw_heap()
