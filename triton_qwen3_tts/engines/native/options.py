"""The native engine's enumerated switches, free of torch so that the repository settings
(``serving/settings.py``) and the benchmarks' argument parsers can list them without loading it."""

KERNELS = ("torch", "triton")  # NativeEngineConfig.kernels: the decode step's layers
# kernels.set_pdl: programmatic dependent launch of the kernels ("few": on for few-row launches)
PDL_MODES = ("off", "on", "prefetch", "few")
# kernels.set_decode_attention: the talker's decode attention with kernels "triton"
DECODE_ATTENTION_MODES = ("triton", "sdpa")
