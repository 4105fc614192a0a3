#!/usr/bin/env bash
# Stability under streaming load on the GPU machine (device tool), i.e. that the service never
# falls over: the real tritonserver on the recommended GPU repository, open-loop Poisson load, stub process ids
# before and after, and the native stacks of any crashed stub (core dumps read with cuda-gdb).
# Carry: .gpu-bundle and .whl (see scripts/gpu_env.sh). Results under $OUT (summary.txt and one
# stability_<tag>.tar.gz with logs, benchmark JSON and backtraces).
#   MODE=sweep       (default) server up, open loop at each of RATES, server down
#   MODE=soak-start  server up, then SOAK_MIN minutes at SOAK_RPS in a detached session; returns
#   MODE=soak-wait   waits for the detached soak (call within 30 s of soak-start), collects it
# Knobs: RATES ("5 10 20 30 40"), FRAMES (50), STREAMS (8), DURATION (12 s a level), SOAK_RPS (20),
#   SOAK_MIN (10), REPO_ARGS (replaces the recommended configuration's flags), TAG,
#   CANCEL_RATE (sweep: one more level at this rate whose client gives up, and cancels on the
#   server, every request not done within CANCEL_TIMEOUT s, default 1: cancels under load).
set -uo pipefail
MODE=${MODE:-sweep}
RATES=${RATES:-"5 10 20 30 40"}
FRAMES=${FRAMES:-50}
STREAMS=${STREAMS:-8}
DURATION=${DURATION:-12}
SOAK_RPS=${SOAK_RPS:-20}
SOAK_MIN=${SOAK_MIN:-10}
TAG=${TAG:-$MODE}
OUT=${OUT:-out}; mkdir -p "$OUT"
W=/tmp/stability; mkdir -p "$W"
REPO_ARGS=${REPO_ARGS:-"--native-compile true --native-batch-buckets 1,8,32,64 --codec-mode stateful --first-chunk-frames 1 --chunk-frames 50 --codec-max-batch-size 32"}
# a fresh machine (the one that started the soak went back: idle for 30 s, or its 30 minutes held)
# has no soak: say so before the environment's set-up, instead of waiting out the call
if [ "$MODE" = soak-wait ] && [ ! -f "$W/soak.txt" ] && [ ! -f "$W/soak.rc" ]; then
  echo "no soak on this machine: soak-start ran on another one, which went back before this call"; exit 1
fi
source scripts/gpu_env.sh
STUB=$TRITON_HOME/triton/backends/python/triton_python_backend_stub

stubs() { ps -eo pid,stat,args | awk '/[t]riton_python_backend_stub/ {print $1, $2, $(NF-1)}' | sort -k3; }

start_server() {
  python scripts/build_model_repository.py --checkpoint "$CKPT" --out "$W/repo" --engine native --device gpu \
    --codec-backend python --codec-dtype bfloat16 --max-num-seqs 64 --max-text-chars 300 --max-instruct-chars 20 \
    --default-max-frames 200 --max-frames-limit 500 --max-in-flight 64 --max-queued 64 \
    --codec-frame-buckets "2,4,8,16,32,64,97" $REPO_ARGS > "$W/build.log" 2>&1 || { cat "$W/build.log"; exit 1; }
  ulimit -c unlimited
  echo '/tmp/core.%e.%p' > /proc/sys/kernel/core_pattern 2>/dev/null || echo "core_pattern not writable"
  rm -f /tmp/core.*
  setsid -w tritonserver --model-repository="$W/repo" --backend-directory="$TRITON_HOME/triton/backends" \
    --allow-gpu-metrics=false --http-port=18000 --grpc-port=18001 --metrics-port=18002 > "$W/server.log" 2>&1 &
  local srv=$! t0=$SECONDS
  until curl -sf localhost:18000/v2/health/ready > /dev/null; do
    sleep 1; [ $((SECONDS - t0)) -gt 400 ] && { echo "server not ready after 400 s"; grep -E "^E|Error" "$W/server.log" | head; exit 1; }
    kill -0 "$srv" 2> /dev/null ||
      { echo "server exited after $((SECONDS - t0)) s"; grep -E "^E|Error" "$W/server.log" | head; exit 1; }
  done
  echo "server ready after $((SECONDS - t0)) s"
  stubs > "$W/stubs_before.txt"; cat "$W/stubs_before.txt"
}

collect() {  # $1: tag
  stubs > "$W/stubs_after.txt"
  echo "stubs before:"; cat "$W/stubs_before.txt"; echo "stubs after:"; cat "$W/stubs_after.txt"
  echo "ready: $(curl -s -o /dev/null -w '%{http_code}' localhost:18000/v2/health/ready)"
  curl -s localhost:18002/metrics | grep -E "^qwen3_tts_(requests|codec|talker)" > "$W/metrics.txt"; grep -E "in_flight|resident|refused|cancelled" "$W/metrics.txt"
  local t0=$SECONDS; pkill -TERM -f "tritonserver --model-repository=$W/repo"
  while pgrep -f "tritonserver --model-repository=$W/repo" > /dev/null && [ $((SECONDS - t0)) -lt 40 ]; do sleep 0.5; done
  echo "shutdown took $((SECONDS - t0)) s"; pkill -KILL -f triton_python_backend_stub; pkill -KILL tritonserver
  grep -nE "Segmentation|Fatal Python|core dumped|not healthy|Traceback" "$W/server.log" | head -20
  for c in /tmp/core.*; do
    [ -e "$c" ] || continue
    echo "core: $c"; timeout 300 cuda-gdb -batch -ex 'info threads' -ex 'thread apply all bt 40' "$STUB" "$c" > "$W/bt_$(basename "$c").txt" 2>&1
    grep -n -B2 -A30 "received signal\|SIGSEGV" "$W/bt_$(basename "$c").txt" | head -80
  done
  tar -C "$W" -czf "$OUT/stability_$1.tar.gz" --exclude=repo . 2>/dev/null; ls -la "$OUT"
}

case $MODE in
  sweep)
    start_server
    # shellcheck disable=SC2086
    timeout 480 python benchmark/benchmark_service.py --url 127.0.0.1:18001 --rate $RATES --streams "$STREAMS" \
      --fixed-frames "$FRAMES" --duration "$DURATION" --warmup 2 --timeout 45 --no-progress \
      --out-json "$W/sweep.json" 2>&1 | tee "$W/sweep.txt" | tail -25
    if [ -n "${CANCEL_RATE:-}" ]; then
      echo "cancels: $CANCEL_RATE req/s, client timeout ${CANCEL_TIMEOUT:-1} s"
      timeout 240 python benchmark/benchmark_service.py --url 127.0.0.1:18001 --rate "$CANCEL_RATE" --streams "$STREAMS" \
        --fixed-frames "$FRAMES" --duration "$DURATION" --warmup 2 --timeout "${CANCEL_TIMEOUT:-1}" --no-progress \
        --out-json "$W/cancels.json" 2>&1 | tee "$W/cancels.txt" | tail -6
      curl -s localhost:18002/metrics | grep -E "^qwen3_tts_requests_(cancelled|in_flight)|resident_states"
    fi
    collect "$TAG" 2>&1 | tee "$OUT/summary_$TAG.txt" ;;
  soak-start)
    start_server
    rm -f "$W/soak.rc" "$W/soak.txt"  # an earlier soak's result on this machine is not this one's
    setsid bash -c "timeout $((SOAK_MIN * 60 + 240)) python benchmark/benchmark_service.py --url 127.0.0.1:18001 \
      --rate $SOAK_RPS --streams $STREAMS --fixed-frames $FRAMES --duration $((SOAK_MIN * 60)) --warmup 2 --timeout 45 \
      --no-progress --out-json $W/soak.json > $W/soak.txt 2>&1; echo \$? > $W/soak.rc" < /dev/null > /dev/null 2>&1 &
    echo "soak started: $SOAK_MIN min at $SOAK_RPS req/s" ;;
  soak-wait)
    while [ ! -f "$W/soak.rc" ]; do sleep 5; done
    echo "soak exit $(cat "$W/soak.rc")"; tail -25 "$W/soak.txt"
    collect "$TAG" 2>&1 | tee "$OUT/summary_$TAG.txt" ;;
esac
