#!/usr/bin/env python3
"""Same as `python -m triton_qwen3_tts.tools.sim_fused` (triton_qwen3_tts/tools/sim_fused.py), which holds the code; --help lists the flags."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without the package installed
from triton_qwen3_tts.tools.sim_fused import *  # noqa: E402,F403  (the module's names, for tests and notebooks)
from triton_qwen3_tts.tools.sim_fused import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
