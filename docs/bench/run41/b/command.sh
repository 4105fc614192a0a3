#!/usr/bin/env bash
# run 41b: main with decode_config from 41a's sweep and the code predictor's next input as a
# gather of the projected tables: the frame step at 1/8/32/64/128 rows; then sampling's
# candidates by a full sort instead of torch.topk (micro timings, and the frame step with the
# sort variant injected), one machine.
O=$OUT; export OUT=/tmp/r41b; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  P="--checkpoint $CKPT --engine native --device cuda --dtype bfloat16 --profile-step --profile-ctx 300 --compile --kernels triton --decode-attention triton --batch-buckets 1 8 32 64 128 --max-num-seqs 128"
  echo "== main $(date +%T)"
  timeout 130 python benchmark/benchmark_model.py $P --json $OUT/profile_main.json
  echo "exit $? $(date +%T)"
  echo "== sampling micro $(date +%T)"
  PYTHONPATH=. timeout 90 python out/devcmd/sample_sort.py
  echo "exit $? $(date +%T)"
  echo "== sort draws $(date +%T)"
  PYTHONPATH=. timeout 130 python out/devcmd/sample_sort.py $P --json $OUT/profile_sort.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
cp out/devcmd/sample_sort.py $OUT/
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *$" | tail -40 | cut -c1-330
tar czf $O/r41b.tar.gz -C /tmp r41b
