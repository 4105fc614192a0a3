"""`tts`: the decoupled BLS model users call. Text (and a voice) in, streamed audio out.

It validates the request, admits it, calls the `talker` model for codec frames and the codec model
for audio, and streams `audio` chunks back as they are decoded, ending every request with exactly
one FINAL. Everything is in :mod:`triton_qwen3_tts.serving.tts` (its Triton layer:
``triton_qwen3_tts/serving/tts/triton.py``).
"""

from triton_qwen3_tts.serving.tts.triton import TritonPythonModel  # noqa: F401
