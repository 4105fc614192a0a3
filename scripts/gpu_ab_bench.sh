#!/usr/bin/env bash
# A/B of two server configurations on the GPU machine (device tool) in one call, balanced for
# the order of measurement: both servers load side by side (scripts/gpu_e2e_bench.sh with PORT,
# REPO, READY_FILE and HOLD; one load time for two configurations), then one closed-loop level
# runs on A, B, B, A, one server at a time, each configuration measured once first and once
# second (run 42: of two servers measured in turn, the first read lower, 596-598 against
# 608-609 audio-s/s at 64 streams, with its 64-row step about 1 % slower). Each level's GPU time
# by group, its gaps under 50 ms by transition and its busy share of the working time come from
# the servers' counters scraped before and after it (scripts/metrics_split.py --pairs, in
# ab_device.txt); the logs' stats lines, every 30 s, from scripts/gpu_busy.py.
#   env: A_ARGS, B_ARGS (build_model_repository.py flags of each, added to run 39c's
#        configuration in BASE_ARGS), LEVEL (default 64), FRAMES (default 200), SERVICE_ARGS
#        (default "--duration 30 --warmup 1"), ORDER (default "A B B A"; a token S@R is an open
#        loop on server S instead: Poisson arrivals at R req/s of OPEN_FRAMES-frame clips,
#        default 50, with OPEN_ARGS, default "--duration 12 --warmup 2 --streams 128"), WARM_S (default 15: an
#        unmeasured level of that many seconds on each server first), READY_S (default 360:
#        each server's wait for readiness), DEADLINE_S (default 570: from this script's start, a
#        level that could not end by then is not started, so that a device call of 600 s keeps
#        what was measured), PACK_CACHE=1 (the compile caches into $OUT/compile.tar.xz: see
#        scripts/gpu_env.sh)
# Results under $OUT: ab.txt (one table line per measurement, in order), ab_<i>_<A|B>.json/.csv,
# metrics_ab_<i>_<A|B>_{before,after}.txt (the server's counters around each), ab_device.txt,
# server_<A|B>.log, gpu_busy_<A|B>.txt.
# Carry .gpu-bundle and .whl, as for gpu_e2e_bench.sh.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
BASE_ARGS=${BASE_ARGS:-"--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"}
LEVEL=${LEVEL:-64}
FRAMES=${FRAMES:-200}
ORDER=${ORDER:-"A B B A"}
READY_S=${READY_S:-360}
DEADLINE_S=${DEADLINE_S:-570}
WARM_S=${WARM_S:-15}
source scripts/gpu_env.sh
end=/tmp/ab_end; rm -f "$end" /tmp/ab_A.ready /tmp/ab_B.ready
# this call's results only (a machine the device tool kept warm still holds the last call's)
rm -f "$OUT/ab.txt" "$OUT/ab_device.txt" "$OUT"/ab_*_[AB].json "$OUT"/ab_*_[AB].csv "$OUT"/metrics_ab_*
port() { if [ "$1" = A ]; then echo 18000; else echo 18100; fi; }
# one level on server $2 within $1 seconds: closed loop at LEVEL streams when $3 is empty, else an
# open loop at $3 req/s; the rest of the arguments for benchmark_service.py; prints its table line
level() {
  local limit=$1 s=$2 rate=$3 key; shift 3
  local load=(--concurrency "$LEVEL" --fixed-frames "$FRAMES")
  key=$LEVEL
  if [ -n "$rate" ]; then
    # shellcheck disable=SC2206
    load=(--rate "$rate" --fixed-frames "${OPEN_FRAMES:-50}" ${OPEN_ARGS:---duration 12 --warmup 2 --streams 128})
    key=$(printf '%g' "$rate")  # as the table prints it
  fi
  timeout "$limit" python benchmark/benchmark_service.py --url "127.0.0.1:$(($(port "$s") + 1))" "${load[@]}" \
    "$@" --no-progress 2>&1 | grep -E "^ +$key " | tail -1
}
for s in A B; do
  if [ "$s" = A ]; then extra=${A_ARGS:-}; else extra=${B_ARGS:-}; fi
  (TAG=$s PORT=$(port $s) REPO=/tmp/repo_$s READY_FILE=/tmp/ab_$s.ready HOLD=$end LEVELS="" RATES="" \
    STAGES=service READY_S=$READY_S REPO_ARGS="$BASE_ARGS $extra" bash scripts/gpu_e2e_bench.sh \
    > "$OUT/console_$s.txt" 2>&1; echo "server $s script exit $? $(date +%T)" >> "$OUT/ab.txt") &
  sleep 10  # the two repository builds and first imports apart
done
# each server's script touches its READY_FILE once ready, or when it exits without a server
for _ in $(seq 1 $((READY_S + 120))); do [ -e /tmp/ab_A.ready ] && [ -e /tmp/ab_B.ready ] && break; sleep 1; done
up=""
for s in A B; do
  if curl -sf "localhost:$(port $s)/v2/health/ready" > /dev/null; then up="$up $s"; else echo "server $s not up: not measured" >> "$OUT/ab.txt"; fi
done
echo "both loaded $(date +%T); servers up:$up; A: ${A_ARGS:-(base)}; B: ${B_ARGS:-(base)}" >> "$OUT/ab.txt"
# an unmeasured level on each server first: in run 43c (both servers just loaded) the first two
# levels read 7-11 % below the later ones on either server; skipped when it would leave fewer
# than two measured levels before DEADLINE_S
if [ "$WARM_S" -gt 0 ] && [ $((DEADLINE_S - SECONDS)) -ge $((2 * (WARM_S + 20) + 2 * 45)) ]; then
  for s in $up; do
    echo "warm-up $s $(date +%T) $(level $((WARM_S + 60)) "$s" "" --duration "$WARM_S" --warmup 1)" >> "$OUT/ab.txt"
  done
fi
i=0
for tok in $ORDER; do
  i=$((i + 1))
  s=${tok%@*} rate=""
  [ "$s" != "$tok" ] && rate=${tok#*@}
  [[ " $up " == *" $s "* ]] || continue
  p=$(port "$s")
  left=$((DEADLINE_S - SECONDS))
  if [ "$left" -lt 80 ]; then echo "$i $s not measured: ${left}s left before DEADLINE_S" >> "$OUT/ab.txt"; continue; fi
  curl -s "localhost:$((p + 2))/metrics" | grep -E "^qwen3_tts" > "$OUT/metrics_ab_${i}_${s}_before.txt"
  if [ -n "$rate" ]; then
    line=$(level $((left - 20 < 300 ? left - 20 : 300)) "$s" "$rate" --out-json "$OUT/ab_${i}_$s.json" \
      --out-csv "$OUT/ab_${i}_$s.csv")
  else
    # shellcheck disable=SC2086
    line=$(level $((left - 20 < 300 ? left - 20 : 300)) "$s" "" ${SERVICE_ARGS:---duration 30 --warmup 1} \
      --out-json "$OUT/ab_${i}_$s.json" --out-csv "$OUT/ab_${i}_$s.csv")
  fi
  echo "$i $tok $(date +%T) $line" >> "$OUT/ab.txt"
  sleep 2  # the tts exports its counters once a second
  curl -s "localhost:$((p + 2))/metrics" | grep -E "^qwen3_tts" > "$OUT/metrics_ab_${i}_${s}_after.txt"
  { echo "$i $s"; python scripts/metrics_split.py --pairs "$OUT/metrics_ab_${i}_${s}_before.txt" \
    "$OUT/metrics_ab_${i}_${s}_after.txt" 2>&1 | grep "GPU:"; } >> "$OUT/ab_device.txt"
done
touch "$end"
wait
for s in A B; do python scripts/gpu_busy.py "$OUT/server_$s.log" > "$OUT/gpu_busy_$s.txt" 2>&1; done
if [ "${PACK_CACHE:-0}" = 1 ]; then
  # the compile caches (scripts/gpu_env.sh's $QWEN3_CACHE), to carry as .gpu-cache/compile.tar.xz:
  # without the compilers' intermediate files (a Triton kernel loads from its cubin and
  # metadata), xz-compressed (at most 16 MiB come back from a device call)
  find "$QWEN3_CACHE/inductor" "$QWEN3_CACHE/triton" -type f \( -name "*.ptx" -o -name "*.ttir" -o -name "*.ttgir" \
    -o -name "*.llir" -o -name "*.source" \) -delete
  tar cf - -C "$QWEN3_CACHE" inductor triton | xz -T0 -6 > "$OUT/compile.tar.xz" && ls -l "$OUT/compile.tar.xz" >> "$OUT/ab.txt"
fi
cat "$OUT/ab.txt" "$OUT/ab_device.txt"
