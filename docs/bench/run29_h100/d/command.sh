#!/usr/bin/env bash
# run 29d: prompts built off the event loop, worker sends from a thread (commits 29363a7, 6c964cb);
# the configuration of 29a's plain server (no codec compile), levels 1 and 64, open 30 req/s
O=$OUT; export OUT=/tmp/r29d; mkdir -p $OUT
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton"
export LEVELS="1 64" RATES="30" SERVICE_ARGS="--duration 12 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=40 READY_S=150
STAGES=service TAG=hostfix REPO_ARGS="$R" timeout 190 bash scripts/gpu_e2e_bench.sh > $OUT/console.txt 2>&1
echo "exit $?" >> $OUT/console.txt
pkill -KILL -f '^tritonserver'
nvidia-smi --query-gpu=name,driver_version --format=csv >> $OUT/console.txt
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | tail -25
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -3 | cut -c1-600
tar czf $O/r29d.tar.gz -C /tmp r29d
