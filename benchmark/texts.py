"""Same as triton_qwen3_tts/tools/bench_texts.py (the built-in benchmark sentences), for scripts that import ``texts``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without the package installed
from triton_qwen3_tts.tools.bench_texts import *  # noqa: E402,F403
