#!/usr/bin/env bash
# The project's test command (README "Run the tests"; CI runs it through .ci/run).
# Builds the CPU environment from the project's own files, then runs the default suite
# (unit + component + system tests on CPU; slow, GPU and TensorRT tests skip with a reason).
#   usage: scripts/test.sh [pytest args...]        env: QWEN3_TTS_VENV (default: .venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${QWEN3_TTS_VENV:-$root/.venv}
bash "$root/scripts/setup_env.sh" "$venv"
cd "$root"
exec "$venv/bin/python" -m pytest -p no:cacheprovider --timeout=900 --durations=15 "$@"
