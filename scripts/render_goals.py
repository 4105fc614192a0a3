#!/usr/bin/env python3
"""Render the current figure of each goal (docs/bench/goals.json) as the Markdown table between
the markers ``<!-- goals:begin -->`` and ``<!-- goals:end -->`` in README.md and
docs/benchmarks.md.

    python scripts/render_goals.py           # rewrite both tables
    python scripts/render_goals.py --check   # exit 1 if a table differs from goals.json (tests)

goals.json: ``{"figures": [{"id", "value", "unit", "command", "commit", "date", "machine"}]}``,
the latest measured figure of each goal; a new measurement replaces its id's entry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOALS = os.path.join(ROOT, "docs", "bench", "goals.json")
TARGETS = (os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "benchmarks.md"))
BEGIN, END = "<!-- goals:begin -->", "<!-- goals:end -->"
FIELDS = ("id", "value", "unit", "command", "commit", "date", "machine")


def load(path: str = GOALS) -> list:
    with open(path) as f:
        figures = json.load(f)["figures"]
    ids = set()
    for fig in figures:
        missing = [k for k in FIELDS if k not in fig]
        if missing:
            raise ValueError(f"{path}: figure {fig.get('id')!r} lacks {missing}")
        if fig["id"] in ids:
            raise ValueError(f"{path}: id {fig['id']!r} appears twice (keep the latest only)")
        ids.add(fig["id"])
    return figures


def table(figures: list) -> str:
    rows = ["| goal | value | unit | commit | date | command |", "|---|---:|---|---|---|---|"]
    for f in figures:
        cmd = f["command"].replace("|", "\\|")
        rows.append(f"| `{f['id']}` | {f['value']} | {f['unit']} | `{f['commit']}` | {f['date']} | `{cmd}` |")
    machines = sorted({f["machine"] for f in figures})
    note = "Machine: " + "; ".join(machines) + "." if machines else ""
    return "\n".join(rows) + ("\n\n" + note if note else "")


def render(text: str, block: str, path: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with what stands between the markers ``begin`` and ``end`` replaced by ``block``
    (also used by scripts/render_settings.py)."""
    if begin not in text or end not in text:
        raise ValueError(f"{path}: no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="report drift instead of rewriting")
    a = p.parse_args(argv)
    block = table(load())
    stale = []
    for path in TARGETS:
        with open(path) as f:
            text = f.read()
        new = render(text, block, path)
        if new != text:
            stale.append(path)
            if not a.check:
                with open(path, "w") as f:
                    f.write(new)
    if a.check and stale:
        print(
            "out of date with docs/bench/goals.json (run python scripts/render_goals.py): "
            + ", ".join(os.path.relpath(s, ROOT) for s in stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
