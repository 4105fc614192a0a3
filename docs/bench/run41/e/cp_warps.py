"""benchmark_model.py with kernels.CP_ATTN_WARPS set: warps, then its args."""
import sys

from triton_qwen3_tts.engines.native import kernels as nk

nk.CP_ATTN_WARPS = int(sys.argv[1])
print("CP_ATTN_WARPS", nk.CP_ATTN_WARPS, flush=True)
from triton_qwen3_tts.tools.bench_model import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
