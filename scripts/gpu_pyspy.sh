#!/usr/bin/env bash
# Sourced by scripts/gpu_e2e_bench.sh and scripts/gpu_scaling_bench.sh: py-spy profiles of a
# running server's tts stub and its engine worker processes during an open loop.
#
#   pyspy_profile NAME GRPC_URL ROOT_PID
#
# runs benchmark/benchmark_service.py at PROFILE_RATE req/s of OPEN_FRAMES-frame clips (default
# 50) for PROFILE_S + 6 seconds (default PROFILE_S 15; OPEN_ARGS as the caller's open loop) and,
# from its fourth second, samples for PROFILE_S seconds at 200 Hz every process under ROOT_PID
# that is an engine worker (`qwen3tts-gpu*`) or a tts stub. Writes, under $OUT:
# profiled_NAME.json / .txt (that open loop's figures), pyspy_NAME_PID.txt (collapsed stacks,
# py-spy's raw format) and pyspy_NAME_PID.log. The py-spy wheel comes from scripts/gpu_wheels.sh.
pyspy_profile() {
  command -v py-spy > /dev/null || { echo "PROFILE_RATE: py-spy missing (scripts/gpu_wheels.sh)" >&2; return; }
  local name=$1 url=$2 root=$3 secs=${PROFILE_S:-15} pids pid jobs
  python scripts/proc_cpu.py snap --root "$root" --out "$OUT/cpu_${name}_pyspy.json" 2> /dev/null
  pids=$(python -c "
import json, sys
d = json.load(open(sys.argv[1]))
print(' '.join(p for p, v in d['procs'].items() if 'qwen3tts-gpu' in v['comm'] or '/tts/' in v['cmd']))
" "$OUT/cpu_${name}_pyspy.json")
  # shellcheck disable=SC2086
  timeout 120 python benchmark/benchmark_service.py --url "$url" --rate "$PROFILE_RATE" --fixed-frames "${OPEN_FRAMES:-50}" \
    ${OPEN_ARGS:---duration 15 --warmup 2 --streams 64} --duration $((secs + 6)) --out-json "$OUT/profiled_$name.json" \
    --no-progress > "$OUT/profiled_$name.txt" 2>&1 &
  jobs=$!  # waited for by pid: a bare `wait` would also wait for the servers, started as jobs
  sleep 4
  for pid in $pids; do
    timeout $((secs + 20)) py-spy record --pid "$pid" --duration "$secs" --rate 200 --nonblocking --format raw \
      -o "$OUT/pyspy_${name}_$pid.txt" > "$OUT/pyspy_${name}_$pid.log" 2>&1 &
    jobs="$jobs $!"
  done
  # shellcheck disable=SC2086
  wait $jobs
  tail -4 "$OUT/profiled_$name.txt"
  ls -la "$OUT"/pyspy_"$name"_* 2>&1 | head
}
