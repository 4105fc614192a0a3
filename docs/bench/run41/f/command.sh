#!/usr/bin/env bash
# run 41f: main (with 41e's code) at 64 streams, closed loop, run 39c's configuration, the
# device session's last minutes (outputs straight into $OUT, so a cut run keeps them).
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export READY_S=250 SERVICE_ARGS="--duration 30 --warmup 1"
source scripts/gpu_env.sh > $OUT/env.txt 2>&1
LEVELS="64" RATES="" STAGES=service TAG=e2e REPO_ARGS="$R" bash scripts/gpu_e2e_bench.sh > $OUT/console.txt 2>&1
tail -8 $OUT/console.txt | cut -c1-250
pkill -KILL -f '^tritonserver'; gzip -f $OUT/server_*.log
