#!/usr/bin/env python3
"""Render the repository settings (triton_qwen3_tts/serving/settings.py) as the Markdown table between
``<!-- settings:begin -->`` and ``<!-- settings:end -->`` in README.md.

    python scripts/render_settings.py           # rewrite the table
    python scripts/render_settings.py --check   # exit 1 if README's table differs (tests/test_settings.py)
"""

from __future__ import annotations

import argparse
import os
import sys

from render_goals import render  # scripts/render_goals.py, beside this file

from triton_qwen3_tts.serving.settings import render_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"


def rendered(text: str) -> str:
    """``text`` with the block between the markers replaced by the current table."""
    return render(text, render_table().rstrip("\n"), "README.md", BEGIN, END)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when README differs")
    a = p.parse_args(argv)
    with open(README) as f:
        text = f.read()
    new = rendered(text)
    if a.check:
        if new != text:
            print("README.md's settings table differs from serving/settings.py: run scripts/render_settings.py")
            return 1
        return 0
    if new != text:
        with open(README, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
