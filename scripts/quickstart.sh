#!/usr/bin/env bash
# Quick start: serve Qwen3-TTS on Triton and write hello.wav.
#
#   scripts/quickstart.sh [--cu12] [--checkpoint DIR | --model HF_ID] [--out hello.wav]
#       Docker + NVIDIA GPU: builds the image (Dockerfile, or Dockerfile.cu12 for drivers older
#       than R580), runs it with the GPU and the mounted checkpoint (or the Hugging Face model id,
#       downloaded inside the container into the cache volume), waits until it is ready (the
#       first start also builds the TensorRT codec engine), synthesizes hello.wav through the
#       client inside the container, copies it out and stops the container.
#
#   scripts/quickstart.sh --cpu [--checkpoint DIR | --model HF_ID] [--out hello.wav]
#       No Docker, no GPU: builds the CPU environment (scripts/setup_env.sh), gets a checkpoint
#       (the given one; else downloads --model, default Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, when
#       the hub answers; else writes a tiny RANDOM checkpoint: the audio is then noise), builds a
#       CPU model repository, starts the server, synthesizes hello.wav, checks it is a 24 kHz WAV,
#       and always stops the server.
#
# Environment: QUICKSTART_DIR or QWEN3_TTS_WORK (work folder, default build/quickstart),
# QWEN3_TTS_VENV (CPU venv, default .venv), HF_TOKEN (gated models), HF_HUB_OFFLINE=1 (never
# download: --cpu then uses the random checkpoint),
# QUICKSTART_READY_TIMEOUT (seconds, default 1800 with Docker, 900 on CPU), QUICKSTART_IMAGE.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mode=docker
cu=13
ckpt=""
model=${QWEN3_TTS_MODEL:-Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice}
out=$PWD/hello.wav
text="Hello from Qwen3-TTS on Triton."
work=${QUICKSTART_DIR:-${QWEN3_TTS_WORK:-$root/build/quickstart}}
venv=${QWEN3_TTS_VENV:-$root/.venv}

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu ;;
    --cu12) cu=12 ;;
    --checkpoint) ckpt=$(cd "$2" && pwd); shift ;;
    --model) model=$2; shift ;;
    --out) out=$2; shift ;;
    --text) text=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case "$out" in /*) ;; *) out=$PWD/$out ;; esac
mkdir -p "$work"
log() { echo "[quickstart] $*" >&2; }

wait_ready() {  # url timeout alive-check-command...
  local url=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until curl -sf -m 2 "$url" >/dev/null 2>&1; do
    if ! "$@"; then log "the server exited before it was ready"; return 1; fi
    if [ $SECONDS -ge $deadline ]; then log "not ready after ${timeout} s"; return 1; fi
    sleep 2
  done
}

# ------------------------------------------------------------------------------------------------
if [ "$mode" = docker ]; then
  command -v docker >/dev/null || { log "docker not found (use --cpu for the CPU stack)"; exit 1; }
  dockerfile=$root/Dockerfile; [ "$cu" = 12 ] && dockerfile=$root/Dockerfile.cu12
  image=${QUICKSTART_IMAGE:-triton-qwen3-tts:cu$cu}
  name=qwen3-tts-quickstart-$$
  log "building $image from $(basename "$dockerfile") (first build downloads the Triton base image and vLLM: many GB)"
  docker build -f "$dockerfile" -t "$image" "$root"
  run_args=(--gpus all --shm-size 2g -p 8000:8000 -p 8001:8001 -p 8002:8002 -p 8080:8080 -v qwen3-tts-cache:/cache)
  if [ -n "$ckpt" ]; then
    run_args+=(-v "$ckpt:/models/checkpoint:ro")
  else
    run_args+=(-e "QWEN3_TTS_MODEL=$model")
    [ -n "${HF_TOKEN:-}" ] && run_args+=(-e HF_TOKEN)
  fi
  # shellcheck disable=SC2329  # called by the EXIT trap
  cleanup() { docker stop -t 30 "$name" >/dev/null 2>&1 || true; docker rm -f "$name" >/dev/null 2>&1 || true; }
  trap cleanup EXIT
  docker run -d --name "$name" "${run_args[@]}" "$image" >/dev/null
  log "container $name started; waiting for readiness (the first start builds the TensorRT codec engine)"
  # shellcheck disable=SC2329  # called by wait_ready
  running() { [ "$(docker inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; }
  if ! wait_ready http://127.0.0.1:8000/v2/health/ready "${QUICKSTART_READY_TIMEOUT:-1800}" running; then
    docker logs --tail 80 "$name" >&2 || true
    exit 1
  fi
  docker exec "$name" python3 -m triton_qwen3_tts.tools.client --text "$text" --out /tmp/hello.wav
  docker cp "$name:/tmp/hello.wav" "$out"
  log "wrote $out"
  exit 0
fi

# ------------------------------------------------------------------------------------------------
# CPU: no Docker
bash "$root/scripts/setup_env.sh" "$venv"
py=$venv/bin/python
random_ckpt=0
if [ -z "$ckpt" ]; then
  dl=$work/checkpoints/${model//\//--}
  if [ -f "$dl/.complete" ]; then
    ckpt=$dl
  elif [ "${HF_HUB_OFFLINE:-0}" != 1 ] && curl -sf -m 5 -o /dev/null "https://huggingface.co/api/models/$model"; then
    log "downloading $model from the Hugging Face hub into $dl"
    "$py" -c "import sys; from huggingface_hub import snapshot_download; snapshot_download(repo_id=sys.argv[1], local_dir=sys.argv[2])" "$model" "$dl"
    touch "$dl/.complete"
    ckpt=$dl
  else
    random_ckpt=1
    ckpt=$work/checkpoints/random-tiny
    if [ ! -f "$ckpt/config.json" ]; then
      "$py" "$root/scripts/make_random_checkpoint.py" --preset tiny --out "$ckpt" --overwrite --no-progress
    fi
  fi
fi
if [ "$random_ckpt" = 1 ]; then
  cat >&2 <<EOF

  ###########################################################################################
  #  WARNING: the Hugging Face hub is unreachable, so a TINY RANDOM checkpoint is served.     #
  #  hello.wav WILL BE NOISE, not speech. Pass --checkpoint DIR (a downloaded Qwen3-TTS       #
  #  checkpoint) or run where huggingface.co is reachable to hear real speech.                 #
  ###########################################################################################

EOF
fi

log "model repository: $work/repo (checkpoint $ckpt)"
# CPU: small limits, so the talker context they need (max_model_len, sized from them) stays small
# and fits the tiny checkpoint's 4096 positions: 1024 frames after up to 500 + 200 characters
"$py" "$root/scripts/build_model_repository.py" --checkpoint "$ckpt" --out "$work/repo" \
  --codec-backend python --device cpu --max-num-seqs 8 --kv-cache-memory-bytes 67108864 --enforce-eager true \
  --max-frames-limit 1024 --default-max-frames 1024 --max-text-chars 500 --max-instruct-chars 200

# free ports (the CI machine is shared)
read -r http grpc metrics gateway < <("$py" -c "
import socket
ss=[socket.socket() for _ in range(4)]
[s.bind(('127.0.0.1', 0)) for s in ss]
print(*[s.getsockname()[1] for s in ss]); [s.close() for s in ss]")
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
rm -f "$work/tritonserver.log"
"$py" -m triton_qwen3_tts.tools.launcher --model-repository "$work/repo" --http-port "$http" --grpc-port "$grpc" \
  --metrics-port "$metrics" --log "$work/tritonserver.log" --gateway-port "$gateway" \
  --gateway-log "$work/gateway.log" > "$work/launcher.log" 2>&1 &
server_pid=$!
stop_server() {
  if kill -0 "$server_pid" 2>/dev/null; then
    log "stopping the server"
    kill -TERM "$server_pid" 2>/dev/null || true  # the launcher stops tritonserver's process group
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT INT TERM
log "server starting (ports http $http, grpc $grpc, metrics $metrics, gateway $gateway; log $work/tritonserver.log)"
alive() { kill -0 "$server_pid" 2>/dev/null; }
if ! wait_ready "http://127.0.0.1:$http/v2/health/ready" "${QUICKSTART_READY_TIMEOUT:-900}" alive; then
  tail -n 60 "$work/tritonserver.log" "$work/launcher.log" >&2 2>/dev/null || true
  exit 1
fi
client_args=(--url "127.0.0.1:$grpc" --text "$text" --out "$out")
# random weights never stop on their own: cap the length
[ "$random_ckpt" = 1 ] && client_args+=(--max-frames 40)
"$py" -m triton_qwen3_tts.tools.client "${client_args[@]}"
"$py" - "$out" <<'PY'
import sys
import soundfile as sf
info = sf.info(sys.argv[1])
assert info.format == "WAV", info.format
assert info.samplerate == 24000, f"sample rate {info.samplerate}, expected 24000"
assert info.channels == 1 and info.frames > 0, (info.channels, info.frames)
print(f"[quickstart] {sys.argv[1]}: valid WAV, 24 kHz mono, {info.frames / info.samplerate:.2f} s")
PY
# the same through the OpenAI-compatible gateway (POST /v1/audio/speech)
frames=""; [ "$random_ckpt" = 1 ] && frames=', "max_frames": 40'
wait_ready "http://127.0.0.1:$gateway/ready" 60 alive
curl -sf "http://127.0.0.1:$gateway/v1/audio/speech" -H 'Content-Type: application/json' \
  -d "{\"model\": \"qwen3-tts\", \"input\": \"Hello from the gateway.\", \"response_format\": \"wav\"$frames}" \
  -o "$work/hello-gateway.wav"
"$py" -c "import soundfile as sf, sys; x, r = sf.read(sys.argv[1]); assert r == 24000 and len(x) > 0, (r, len(x)); \
print(f'[quickstart] gateway: {sys.argv[1]}: {len(x) / r:.2f} s at {r} Hz')" "$work/hello-gateway.wav"
if [ "$random_ckpt" = 1 ]; then
  log "REMINDER: $out comes from a RANDOM checkpoint and is noise."
fi
