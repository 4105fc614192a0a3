"""`talker`: the decoupled model hosting the talker engine (vLLM with our plugin, or the native
CUDA-graph engine). A synthesis request streams `codes` [n, 16]; an abort request
(`abort_request_id`) ends a live synthesis (the tts uses it when its client cancels).

Everything is in :mod:`triton_qwen3_tts.serving.talker` (its Triton layer:
``triton_qwen3_tts/serving/talker/triton.py``).
"""

from triton_qwen3_tts.serving.talker.triton import TritonPythonModel  # noqa: F401
