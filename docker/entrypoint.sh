#!/usr/bin/env bash
# Entrypoint of the triton-qwen3-tts images (Dockerfile, Dockerfile.cu12). See docs/docker.md.
#
#  1. checkpoint: $QWEN3_TTS_CHECKPOINT (default /models/checkpoint, a mounted folder) if it holds
#     config.json; otherwise $QWEN3_TTS_MODEL: a local folder, or a Hugging Face model id that is
#     downloaded once into $QWEN3_TTS_CACHE/checkpoints/ (huggingface_hub.snapshot_download; HF_TOKEN
#     and $QWEN3_TTS_MODEL_REVISION are honoured).
#  2. codec engine (codec backend tensorrt): built on first start and cached in
#     $QWEN3_TTS_CACHE/engines/<key>/codec.plan, key = checkpoint codec + TensorRT version + GPU +
#     exporter sources + build args; later starts reuse it.
#  3. model repository: scripts/build_model_repository.py into $QWEN3_TTS_REPOSITORY.
#  4. server: python -m triton_qwen3_tts.tools.launcher --address 0.0.0.0 --server image (exec'd, so
#     `docker stop` reaches it), with the OpenAI-compatible gateway on :8080 (voices in
#     $QWEN3_TTS_CACHE/voices; `--gateway-port 0` turns it off); arguments given to the container
#     are appended to the launcher's.
# A first argument that does not start with '-' is run instead (e.g. `docker run ... IMAGE bash`).
set -euo pipefail

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  exec "$@"
fi

APP=${QWEN3_TTS_APP:-/opt/triton-qwen3-tts}
CKPT_DIR=${QWEN3_TTS_CHECKPOINT:-/models/checkpoint}
CACHE=${QWEN3_TTS_CACHE:-/cache}
MODEL=${QWEN3_TTS_MODEL:-}
REVISION=${QWEN3_TTS_MODEL_REVISION:-}
REPO=${QWEN3_TTS_REPOSITORY:-/tmp/model_repository}
CODEC_BACKEND=${QWEN3_TTS_CODEC_BACKEND:-tensorrt}
TRT_ARGS=${QWEN3_TTS_TRT_ARGS:-}
REPO_ARGS=${QWEN3_TTS_REPO_ARGS:-}
SERVER_LOG=${QWEN3_TTS_SERVER_LOG:-/dev/stdout}
GATEWAY_LOG=${QWEN3_TTS_GATEWAY_LOG:-/dev/stdout}
PY=${PYTHON:-python3}

log() { echo "[qwen3-tts] $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$CACHE" || die "cache folder $CACHE is not writable (mount a volume at /cache)"

# ---- 1. checkpoint -------------------------------------------------------------------------
if [ -f "$CKPT_DIR/config.json" ]; then
  ckpt=$CKPT_DIR
  log "checkpoint: mounted folder $ckpt"
elif [ -n "$MODEL" ] && [ -f "$MODEL/config.json" ]; then
  ckpt=$MODEL
  log "checkpoint: folder $ckpt"
elif [ -n "$MODEL" ]; then
  ckpt="$CACHE/checkpoints/${MODEL//\//--}${REVISION:+@$REVISION}"
  if [ ! -f "$ckpt/.complete" ]; then
    log "checkpoint: downloading $MODEL${REVISION:+ ($REVISION)} from the Hugging Face hub into $ckpt"
    mkdir -p "$ckpt"
    "$PY" - "$MODEL" "$ckpt" "$REVISION" <<'PY'
import sys
from huggingface_hub import snapshot_download
repo_id, out, rev = sys.argv[1], sys.argv[2], sys.argv[3] or None
snapshot_download(repo_id=repo_id, local_dir=out, revision=rev)
PY
    [ -f "$ckpt/config.json" ] || die "$MODEL: downloaded snapshot has no config.json"
    touch "$ckpt/.complete"
  else
    log "checkpoint: cached download $ckpt"
  fi
else
  die "no checkpoint: mount one at $CKPT_DIR (a folder with config.json) or set QWEN3_TTS_MODEL to a Hugging Face model id, e.g. Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
fi

# ---- 2. TensorRT codec engine (cached) -------------------------------------------------------
plan_args=()
if [ "$CODEC_BACKEND" = "tensorrt" ]; then
  trt_version=$("$PY" -c "import tensorrt; print(tensorrt.__version__)") \
    || die "TensorRT's Python package is missing (set QWEN3_TTS_CODEC_BACKEND=python to serve the codec with torch)"
  gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n1 || true)
  [ -n "$gpu" ] || gpu=$("$PY" -c "import torch; p=torch.cuda.get_device_properties(0); print(p.name, f'{p.major}.{p.minor}')" 2>/dev/null || echo unknown-gpu)
  # codec identity: the speech tokenizer's files (names, sizes) and config, not the whole checkpoint
  codec_id=$(cd "$ckpt" && { find speech_tokenizer -type f -printf '%p %s\n' 2>/dev/null | sort; \
                              cat speech_tokenizer/config.json 2>/dev/null || true; } | sha256sum | cut -c1-16)
  tool_id=$(cd "$APP" && cat export/export_codec_onnx.py export/build_trt_engine.py \
                             triton_qwen3_tts/export/codec_onnx.py triton_qwen3_tts/model/codec.py 2>/dev/null | sha256sum | cut -c1-12)
  key=$(printf '%s|%s|%s|%s|%s' "$codec_id" "$trt_version" "$gpu" "$tool_id" "$TRT_ARGS" | sha256sum | cut -c1-16)
  engine_dir="$CACHE/engines/trt${trt_version}-$key"
  plan="$engine_dir/codec.plan"
  mkdir -p "$engine_dir"
  exec 9>"$engine_dir/.lock"
  flock 9  # two containers sharing /cache build the engine once
  if [ ! -s "$plan" ]; then
    log "codec engine: building for TensorRT $trt_version on '$gpu' (first start; cached in $engine_dir)"
    tmp="$engine_dir/tmp.$$"
    mkdir -p "$tmp"
    (cd "$APP" && "$PY" export/export_codec_onnx.py --checkpoint "$ckpt" --out "$tmp/codec_decoder.onnx") \
      || die "ONNX export of the codec failed"
    # shellcheck disable=SC2086  # TRT_ARGS is a list of flags
    (cd "$APP" && "$PY" export/build_trt_engine.py --onnx "$tmp/codec_decoder.onnx" --out "$tmp/codec.plan" \
        --timing-cache "$CACHE/engines/timing-trt${trt_version}.cache" $TRT_ARGS) \
      || die "TensorRT engine build failed"
    mv "$tmp/codec.plan" "$plan"
    printf 'checkpoint=%s\nmodel=%s\ntensorrt=%s\ngpu=%s\ntrt_args=%s\n' "$ckpt" "$MODEL" "$trt_version" "$gpu" "$TRT_ARGS" \
      > "$engine_dir/key.txt"
    rm -rf "$tmp"
  else
    log "codec engine: cached $plan"
  fi
  flock -u 9
  plan_args=(--plan "$plan")
fi

# ---- 3. model repository -------------------------------------------------------------------
log "model repository: $REPO (codec backend $CODEC_BACKEND)"
# shellcheck disable=SC2086  # REPO_ARGS is a list of flags
(cd "$APP" && "$PY" scripts/build_model_repository.py --checkpoint "$ckpt" --out "$REPO" \
    --codec-backend "$CODEC_BACKEND" --device gpu "${plan_args[@]}" $REPO_ARGS) \
  || die "building the model repository failed"

# ---- 4. server -----------------------------------------------------------------------------
log "starting Triton (HTTP :8000, gRPC :8001, metrics :8002) and the gateway (:8080)"
exec "$PY" -m triton_qwen3_tts.tools.launcher --model-repository "$REPO" --address 0.0.0.0 --server image \
  --log "$SERVER_LOG" --gateway-log "$GATEWAY_LOG" "$@"
