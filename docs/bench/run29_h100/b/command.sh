#!/usr/bin/env bash
# run 29b: (1) the stateful codec's warm-up with codec_compile, per slot; (2) programmatic
# dependent launch A/B on the frame step (kernels triton, compiled sampling)
O=$OUT; export OUT=/tmp/r29b; mkdir -p $OUT
source scripts/gpu_env.sh > $OUT/env.txt 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import triton; print('triton', triton.__version__)" >> $OUT/gpu.txt
{
  echo "== codec plain $(date +%T)"
  timeout 60 python out/devcmd/codec_warm.py /tmp/ckpt-1.7b-customvoice plain 2>&1 | grep -v -i warn | tail -40
  echo "== codec compile $(date +%T)"
  TORCH_LOGS=recompiles timeout 150 python out/devcmd/codec_warm.py /tmp/ckpt-1.7b-customvoice compile > $OUT/codec_compile.log 2>&1
  echo "exit $?"; grep -E "^compile" $OUT/codec_compile.log
  grep -c -i "recompil" $OUT/codec_compile.log
} > $OUT/codec.txt 2>&1
P="python benchmark/benchmark_model.py --random-preset 1.7b-customvoice --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --batch-buckets 1 8 32 64 --compile --kernels triton"
for mode in ${PDL_MODES:-off on prefetch}; do
  extra=""; [ "$mode" != off ] && extra="--cp-parity 256"
  left=$((565 - SECONDS)); [ $left -gt 150 ] && left=150
  [ $left -lt 40 ] && { echo "== pdl $mode skipped: no time left"; continue; }
  echo "== pdl $mode $(date +%T) (limit ${left}s)"
  timeout $left $P --pdl $mode $extra --json $OUT/prof_pdl_$mode.json 2>&1 | grep -v -i "warn" | tail -9
  echo "exit $? $(date +%T)"
done > $OUT/console.txt 2>&1
cat $OUT/codec.txt $OUT/console.txt
tar czf $O/r29b.tar.gz -C /tmp r29b
