"""`codec_decoder`, Python-backend variant (where TensorRT is missing): same name, inputs and
outputs as the TensorRT plan; Triton's dynamic batcher hands it ragged requests, decoded in one call.

Everything is in :mod:`triton_qwen3_tts.serving.codec` (its Triton layer:
``triton_qwen3_tts/serving/codec/triton.py``, class ``CodecDecoderModel``).
"""

from triton_qwen3_tts.serving.codec.triton import CodecDecoderModel as TritonPythonModel  # noqa: F401
