#!/usr/bin/env bash
# Throughput against GPU count on a machine of two or more GPUs (device tool, kind nvidia-h100-x2),
# one call. Two servers of the same repository settings (REPO_ARGS) but for --gpus:
#   A: --gpus 1, its processes pinned to GPU 0 (CUDA_VISIBLE_DEVICES=0), ports 18000-18002;
#   B: --gpus $GPUS_B (default 2) over every GPU, ports 19000-19002.
# Both start at once (their start-ups overlap; neither is measured while the other warms up), then
# A is measured while B idles (an idle engine waits on an event: no GPU work), A stops, and B is
# measured. Each server: a closed loop of FRAMES-frame requests at LEVELS_A / LEVELS_B streams,
# then an open loop (Poisson arrivals, OPEN_FRAMES-frame clips) at RATES_A / RATES_B req/s with
# its capacity line. scripts/scaling_report.py prints the table and scaling_2gpu_ratio: B's served
# audio-s/s at its capacity rate over A's. GATEWAY=1 adds, last, on server B, one stream of gRPC
# TTFA vs the OpenAI gateway's time to first byte (benchmark/benchmark_gateway.py, GATEWAY_ARGS).
# A server that does not become ready is reported and the other one is still measured.
# Each measurement also records the CPU use of every process of the server (scripts/proc_cpu.py:
# cpu_closed_X.json, cpu_open_X.json); PROFILE_RATE=R adds, for the servers in PROFILE_ON (default
# b), a py-spy profile of the tts stub and its engine workers during an open loop at R req/s
# (PROFILE_S seconds; the py-spy wheel comes from scripts/gpu_wheels.sh; collapsed stacks in
# pyspy_X_PID.txt).
# Carry: .gpu-bundle and .whl (see scripts/gpu_env.sh). Results under $OUT, written as they come;
# PACK=FILE also packs $OUT into the tar.gz FILE after each phase (the device tool returns at most
# 8 files, so a call keeps its results in one archive, complete up to the phase it reached).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
# CKPT set: the environment is ready (tritonserver on PATH, TRITON_HOME set), e.g. a CPU smoke run
# with DEVICE=cpu; else scripts/gpu_env.sh prepares it and writes the checkpoint.
[ -n "${CKPT:-}" ] || source scripts/gpu_env.sh
DEVICE=${DEVICE:-gpu}
source scripts/gpu_pyspy.sh
FRAMES=${FRAMES:-200}
GPUS_B=${GPUS_B:-2}
LEVELS_A=${LEVELS_A:-64}
LEVELS_B=${LEVELS_B:-"64 128"}
RATES_A=${RATES_A:-"8 12 16 20"}
RATES_B=${RATES_B:-"16 24 32 40"}
CLOSED_ARGS=${CLOSED_ARGS:-"--duration 12 --warmup 1"}
OPEN_ARGS=${OPEN_ARGS:-"--duration 12 --warmup 2 --streams 64"}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,memory.used --format=csv > "$OUT/gpus.txt" 2>&1; cat "$OUT/gpus.txt"

build() {  # build DIR GPUS
  # shellcheck disable=SC2086
  python scripts/build_model_repository.py --checkpoint "$CKPT" --out "$1" --engine native --device "$DEVICE" \
    --codec-backend python --codec-dtype bfloat16 --max-num-seqs 64 --max-text-chars 300 --max-instruct-chars 20 \
    --default-max-frames "$FRAMES" --max-frames-limit 500 --max-in-flight 64 --max-queued 64 \
    --codec-frame-buckets "2,4,8,16,32,64,97" --gpus "$2" ${REPO_ARGS:-} > "$OUT/build_$(basename "$1").txt" 2>&1 \
    || { echo "build of $1 failed" >&2; tail -5 "$OUT/build_$(basename "$1").txt" >&2; exit 1; }
}
start() {  # start NAME PORT_BASE REPO [CUDA_VISIBLE_DEVICES]
  ( [ -n "${4:-}" ] && export CUDA_VISIBLE_DEVICES=$4
    exec setsid tritonserver --model-repository="$3" --backend-directory="$TRITON_HOME/triton/backends" \
      --allow-gpu-metrics=false --http-port="$2" --grpc-port=$(($2 + 1)) --metrics-port=$(($2 + 2)) \
      > "$OUT/server_$1.log" 2>&1 ) &
}
pack() { if [ -n "${PACK:-}" ]; then tar czf "$PACK.tmp" -C "$OUT" . && mv "$PACK.tmp" "$PACK"; fi; }
ready() { curl -sf "localhost:$1/v2/health/ready" > /dev/null; }
server_pid() { pgrep -f "model-repository=/tmp/repo_$1" | head -1; }
cpu_snap() {  # cpu_snap NAME LABEL: CPU seconds of server NAME's process tree (scripts/proc_cpu.py)
  python scripts/proc_cpu.py snap --root "$(server_pid "$1")" --out "$OUT/cpu_$1_$2.json" 2>/dev/null
}
measure() {  # measure NAME PORT_BASE LEVELS RATES
  local grpc=127.0.0.1:$(($2 + 1))
  cpu_snap "$1" closed0
  # shellcheck disable=SC2086
  timeout 200 python benchmark/benchmark_service.py --url "$grpc" --concurrency $3 --fixed-frames "$FRAMES" \
    $CLOSED_ARGS --out-json "$OUT/closed_$1.json" --no-progress 2>&1 | tail -8
  cpu_snap "$1" closed1
  # shellcheck disable=SC2086
  timeout 300 python benchmark/benchmark_service.py --url "$grpc" --rate $4 --fixed-frames "${OPEN_FRAMES:-50}" \
    $OPEN_ARGS --out-json "$OUT/open_$1.json" --no-progress 2>&1 | tail -10
  cpu_snap "$1" open1
  # which process is busy: per-process CPU over the closed loop, then over the open loop
  python scripts/proc_cpu.py diff "$OUT/cpu_$1_closed0.json" "$OUT/cpu_$1_closed1.json" --out-json "$OUT/cpu_closed_$1.json" | head -8
  python scripts/proc_cpu.py diff "$OUT/cpu_$1_closed1.json" "$OUT/cpu_$1_open1.json" --out-json "$OUT/cpu_open_$1.json" | head -8
  if [ -n "${PROFILE_RATE:-}" ] && [[ " ${PROFILE_ON:-b} " == *" $1 "* ]]; then pyspy_profile "$1" "$grpc" "$(server_pid "$1")"; fi
  curl -s "localhost:$(($2 + 2))/metrics" | grep -E "^qwen3_tts|^nv_inference_(count|request_success)" > "$OUT/metrics_$1.txt"
}

build /tmp/repo_a 1
build /tmp/repo_b "$GPUS_B"
t0=$(date +%s)
start a 18000 /tmp/repo_a 0
start b 19000 /tmp/repo_b
# ok_X: 0 loading, 1 ready, 2 gone (a server whose process is gone will not become ready); wait
# until neither is loading, so that one server's failure does not cut the other's start short
ok_a=0; ok_b=0
for _ in $(seq 1 "${READY_S:-300}"); do
  if [ $ok_a = 0 ] && ready 18000; then ok_a=1; echo "A ready after $(($(date +%s) - t0)) s"; fi
  if [ $ok_b = 0 ] && ready 19000; then ok_b=1; echo "B ready after $(($(date +%s) - t0)) s"; fi
  if [ $ok_a = 0 ] && ! pgrep -f "model-repository=/tmp/repo_a" > /dev/null; then ok_a=2; fi
  if [ $ok_b = 0 ] && ! pgrep -f "model-repository=/tmp/repo_b" > /dev/null; then ok_b=2; fi
  [ $ok_a != 0 ] && [ $ok_b != 0 ] && break
  sleep 1
done
for s in a b; do
  v=ok_$s
  if [ "${!v}" != 1 ]; then
    echo "server $s not ready after $(($(date +%s) - t0)) s:" >&2
    grep -E "^E|Error" "$OUT/server_$s.log" | head -20 | cut -c1-600 >&2
  fi
done
pack
if [ $ok_a = 1 ]; then echo "== A: --gpus 1 (GPU 0)"; measure a 18000 "$LEVELS_A" "$RATES_A"; pack; fi
pkill -TERM -f "model-repository=/tmp/repo_a"; sleep 5
if [ $ok_b = 1 ]; then echo "== B: --gpus $GPUS_B"; measure b 19000 "$LEVELS_B" "$RATES_B"; pack; fi
[ $ok_a = 1 ] && [ $ok_b = 1 ] && python scripts/scaling_report.py --one "$OUT/closed_a.json" "$OUT/open_a.json" \
  --many "$OUT/closed_b.json" "$OUT/open_b.json" --gpus "$GPUS_B" --out-json "$OUT/scaling.json"
if [ "${GATEWAY:-0}" = 1 ] && [ $ok_b = 1 ]; then
  if python -c "import fastapi, uvicorn, multipart" 2>/dev/null; then
    python -m triton_qwen3_tts.gateway.main --triton-url 127.0.0.1:19001 --port 18080 \
      --voices-dir /tmp/voices_scaling > "$OUT/gateway.log" 2>&1 &
    gateway_pid=$!
    for _ in $(seq 1 60); do curl -sf localhost:18080/ready > /dev/null && break; sleep 1; done
    # shellcheck disable=SC2086
    timeout 150 python benchmark/benchmark_gateway.py --grpc-url 127.0.0.1:19001 --gateway-url http://127.0.0.1:18080 \
      ${GATEWAY_ARGS:---requests 20 --warmup 3 --max-frames 50 --formats pcm wav} --out-json "$OUT/gateway.json" 2>&1 | tail -10
    kill -TERM "$gateway_pid"; wait "$gateway_pid" 2>/dev/null
    pack
  else
    echo "gateway skipped: fastapi, uvicorn or python-multipart missing (carry their wheels in .whl/gateway)" >&2
  fi
fi
pkill -TERM -f '^tritonserver'; sleep 3; pkill -KILL -f triton_python_backend_stub
grep -hE "^E|Traceback|Error" "$OUT"/server_*.log | head -20 | cut -c1-400
pack
