"""`codec_decoder_stateful`, Python backend: exact stateful decoding of only the new frames of each
stream, the decoder state passed with each request or kept resident in the model.

Everything is in :mod:`triton_qwen3_tts.serving.codec` (its Triton layer:
``triton_qwen3_tts/serving/codec/triton.py``, class ``StatefulCodecModel``).
"""

from triton_qwen3_tts.serving.codec.triton import StatefulCodecModel as TritonPythonModel  # noqa: F401
