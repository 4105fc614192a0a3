"""vLLM general plugin entry point (``vllm.general_plugins``): registers the talker architecture.

Declared in ``pyproject.toml`` as ``qwen3_tts_triton = "qwen3_tts_triton.vllm_plugin:register"``.
vLLM calls it in every process it starts (frontend, EngineCore, workers), which is why in-script
``ModelRegistry.register_model`` is not enough with ``AsyncLLM`` (EngineCore is a child process).
"""

ARCH = "Qwen3TTSTalkerForVLLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "qwen3_tts_triton.vllm_talker:Qwen3TTSTalkerForVLLM")
