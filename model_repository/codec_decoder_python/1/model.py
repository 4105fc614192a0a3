"""`codec_decoder`, Python-backend variant: same name, inputs and outputs as the TensorRT plan.

Thin adapter: Triton's dynamic batcher hands us a list of requests (ragged frames allowed); the
package stacks them into one decode call and splits the result (qwen3_tts_triton.serving).
"""

import locale

locale.setlocale(locale.LC_CTYPE, "C.UTF-8")  # the stub starts with an ASCII locale (runbook C3)

import faulthandler  # noqa: E402

# A crash inside the stub (a C extension, the backend itself) then leaves every thread's Python
# stack in the server log instead of only "Stub process is not healthy".
faulthandler.enable()

import json  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from qwen3_tts_triton import profiling  # noqa: E402
from qwen3_tts_triton.serving.codec_batch import check_codes, decode_batched  # noqa: E402
from qwen3_tts_triton.serving.codec_runtime import make_codec  # noqa: E402
from qwen3_tts_triton.serving.model_config import (  # noqa: E402
    CodecModelConfig, parameters_from_model_config)


class TritonPythonModel:
    def initialize(self, args):
        profiling.maybe_start("codec_decoder")  # QWEN3_TTS_PROFILE_DIR set: stack samples (diagnostics)
        model_config = json.loads(args["model_config"])
        self.cfg = CodecModelConfig.from_parameters(parameters_from_model_config(model_config))
        self.max_batch = int(model_config.get("max_batch_size", 0)) or None
        self.codec = make_codec(self.cfg)
        self.codec.warmup()
        self.spf = self.codec.samples_per_frame

    def execute(self, requests):
        responses = [None] * len(requests)
        good, arrays = [], []
        for i, req in enumerate(requests):
            try:
                codes = pb_utils.get_input_tensor_by_name(req, "audio_codes").as_numpy()
                arrays.append(check_codes(codes, max_frames=self.cfg.max_frames))
                good.append(i)
            except ValueError as e:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(e), pb_utils.TritonError.INVALID_ARG))
        if arrays:
            try:
                outs = decode_batched(arrays, self.codec.decode, self.spf,
                                      frame_buckets=None, max_batch=self.max_batch)
                for i, out in zip(good, outs):
                    responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("audio_values", out)])
            except Exception as e:  # a decoder failure fails this batch, not the server
                for i in good:
                    responses[i] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"codec decode failed: {e}", pb_utils.TritonError.INTERNAL))
        return responses

    def finalize(self):
        self.codec = None
        profiling.stop()
