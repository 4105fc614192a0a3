"""benchmark_model.py with the decode attention on a sweep's fastest configurations: attn.json, then its args."""
import json
import sys

from triton_qwen3_tts.engines.native import kernels as nk

best = {(r["B"], r["C"]): tuple(r["best"]) for r in json.load(open(sys.argv[1]))}
print("decode attention configurations:", best, flush=True)
orig = nk.decode_config
nk.decode_config = lambda B, kv, C, sms: best.get((B, C)) or orig(B, kv, C, sms)
from triton_qwen3_tts.tools.bench_model import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
