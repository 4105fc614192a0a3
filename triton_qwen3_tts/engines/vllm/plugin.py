"""vLLM general plugin entry point (``vllm.general_plugins``): registers the talker architecture.

Declared in ``pyproject.toml`` as ``triton_qwen3_tts = "triton_qwen3_tts.engines.vllm.plugin:register"``.
vLLM calls it in every process it starts (frontend, EngineCore, workers), which is why in-script
``ModelRegistry.register_model`` is not enough with ``AsyncLLM`` (EngineCore is a child process).
"""

ARCH = "Qwen3TTSTalkerForVLLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "triton_qwen3_tts.engines.vllm.model:Qwen3TTSTalkerForVLLM")
