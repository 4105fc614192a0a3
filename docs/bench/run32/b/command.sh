#!/usr/bin/env bash
# run 32b: waits for the soak r32a_start.sh started and collects it; then the talker engine alone
# (no server, no codec), 64 closed-loop streams of 200 frames, with and without overlap_steps
O=$OUT
export OUT=$OUT MODE=soak-wait TAG=soak32a
bash scripts/gpu_stability.sh 2>&1 | tail -45
grep -rh "native_kernels" /tmp/stability/server.log | head -5 | cut -c1-300
mkdir -p /tmp/r32b
{
  source scripts/gpu_env.sh
  for ov in on off; do
    F=""; [ $ov = off ] && F="--no-overlap"
    echo "== engine overlap $ov $(date +%T)"
    timeout 110 python benchmark/benchmark_model.py --checkpoint "$CKPT" --engine native --device cuda --dtype bfloat16 \
      --concurrency 64 --frames 200 --rounds 3 --batch-buckets 64 --kernels triton $F --json /tmp/r32b/engine_$ov.json
    echo "exit $? $(date +%T)"
  done
} > /tmp/r32b/console.txt 2>&1
grep -v "UserWarning\|_warn_once" /tmp/r32b/console.txt | tail -30 | cut -c1-200
tar czf $O/r32b.tar.gz -C /tmp r32b
