#!/usr/bin/env bash
# The GPU fast paths on the GPU machine (device tool): the talker step (compiled blocks), the
# stateful codec with and without the compiled step, and the parity of each fast path against its
# fallback (scripts/fastpath_parity.py). Each stage has its own time limit
# (inductor compiles are part of what is measured); results and one log under $OUT.
#   env: STAGES (default "step-blocks codec parity"), BUCKETS (default "1 64"), CODEC_BATCH ("32 64"),
#        CODEC_ARGS (extra benchmark_codec.py flags), T_STEP/T_CODEC/T_PARITY (seconds)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
STAGES=${STAGES:-step-blocks codec parity}
BUCKETS=${BUCKETS:-1 64}
CODEC_BATCH=${CODEC_BATCH:-32 64}
log="$OUT/fastpath.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv
  python3 -c "import torch; print('torch', torch.__version__)"; git log -1 --format='commit %h %s' 2>/dev/null; } | tee "$log"
stage() { echo "=== $1 ($(date -u +%T))" | tee -a "$log"; }
for s in $STAGES; do
  case $s in
  step-blocks)
    stage "talker step: compiled blocks"
    timeout "${T_STEP:-200}" python3 benchmark/benchmark_model.py --random-preset 1.7b-customvoice --engine native \
      --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --batch-buckets $BUCKETS \
      --json "$OUT/step_blocks.json" 2>&1 | grep -v Warning | tail -12 | tee -a "$log" ;;
  codec)
    stage "stateful codec: graph vs compiled step + graph"
    /usr/bin/time -f "wall %e s" timeout "${T_CODEC:-240}" python3 benchmark/benchmark_codec.py --device cuda \
      --dtype bfloat16 --batch $CODEC_BATCH --chunk 25 --modes stateful --backends graph compile-graph \
      ${CODEC_ARGS:-} --json "$OUT/codec.json" 2>&1 | grep -v Warning | tail -12 | tee -a "$log" ;;
  parity)
    stage "parity"
    timeout "${T_PARITY:-240}" python3 scripts/fastpath_parity.py --dtype bfloat16 --rows 8 --steps 250 \
      --codec-streams 16 --json "$OUT/parity.json" 2>&1 | grep -v Warning | tail -12 | tee -a "$log" ;;
  esac
done
stage "done"
