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
# A private temp root: pytest prunes old /tmp/pytest-of-$USER/pytest-N dirs, which would delete a
# concurrently running session's server files (and vice versa).
basetemp=$(mktemp -d "${TMPDIR:-/tmp}/qwen3-tts-tests.XXXXXX")
exec "$venv/bin/python" -m pytest --basetemp="$basetemp" -p no:cacheprovider --timeout=900 --durations=15 "$@"
