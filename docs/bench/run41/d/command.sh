#!/usr/bin/env bash
# run 41d: the frame step of main (41b's code) twice more on another machine, and with the code
# predictor's attention on 2 and 8 warps a program (4 on main), one machine.
O=$OUT; export OUT=/tmp/r41d; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  P="--checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 8 32 64"
  echo "== main $(date +%T)"
  timeout 110 python benchmark/benchmark_model.py $P --json $OUT/profile_main.json
  echo "exit $? $(date +%T)"
  for w in 8 2; do
    echo "== cp attention warps $w $(date +%T)"
    PYTHONPATH=. timeout 100 python out/devcmd/cp_warps.py $w $P --json $OUT/profile_cpw$w.json
    echo "exit $? $(date +%T)"
  done
  echo "== main again $(date +%T)"
  timeout 100 python benchmark/benchmark_model.py $P --json $OUT/profile_main2.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
cp out/devcmd/cp_warps.py $OUT/
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *$" | grep -v "^per-frame step" | tail -40 | cut -c1-200
tar czf $O/r41d.tar.gz -C /tmp r41d
