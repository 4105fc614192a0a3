#!/usr/bin/env python3
"""Same as `qwen3-tts-bench-gateway` (triton_qwen3_tts/tools/bench_gateway.py), which holds the code; --help lists the flags."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without the package installed
from triton_qwen3_tts.tools.bench_gateway import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
