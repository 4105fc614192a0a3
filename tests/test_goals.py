"""docs/bench/goals.json is well formed and the performance tables of README.md and
docs/benchmarks.md are the ones scripts/render_goals.py renders from it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import render_goals  # noqa: E402


def test_goals_json_is_complete():
    figs = render_goals.load()
    ids = {f["id"] for f in figs}
    for required in ("soak_minutes", "soak_rps", "soak_stub_deaths", "soak_failed_requests"):
        assert required in ids


def test_tables_match_goals_json():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_goals.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_render_replaces_only_between_markers():
    text = "a\n<!-- goals:begin -->\nold\n<!-- goals:end -->\nb\n"
    out = render_goals.render(text, "NEW", "x")
    assert out == "a\n<!-- goals:begin -->\nNEW\n<!-- goals:end -->\nb\n"
