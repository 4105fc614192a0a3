"""triton-qwen3-tts: Qwen3-TTS 12 Hz served on NVIDIA Triton Inference Server.

The package holds all logic; the Triton models in ``model_repository/`` are thin adapters.
Importing the package imports neither vLLM nor Triton.
"""

__version__ = "0.1.0"
