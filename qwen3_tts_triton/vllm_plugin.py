"""vLLM general plugin entry point (``vllm.general_plugins``): registers the talker architecture."""


def register() -> None:  # filled in by the talker-on-vLLM work (issue 3)
    return None
