#!/usr/bin/env bash
# run 41c: main (41a-b: decode attention rule, projected residual tables) end to end at 1, 64 and again 1 stream (closed loop, 200 frames; the second one-stream level on a warm server: 40d had one stream TTFA p95 44 ms on the cold server) and 70 req/s, run 39c's
# configuration, with the loop's host time per phase in the server's stats lines
# (scripts/gpu_busy.py on its log).
mkdir -p $OUT
O=$OUT; export OUT=/tmp/r41c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export PER_RATE=1 OPEN_TIMEOUT=60 READY_S=330 SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
{
  source scripts/gpu_env.sh
  echo "== e2e $(date +%T)"
  LEVELS="1 64 1" RATES="70" STAGES=service TAG=e2e REPO_ARGS="$R" timeout 480 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
  python scripts/gpu_busy.py $OUT/server_e2e.log > $OUT/gpu_busy.txt 2>&1
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "^open loop;\|level    ok" | tail -30 | cut -c1-300
cat $OUT/gpu_busy.txt | cut -c1-400
gzip -f $OUT/server_*.log 2>/dev/null
tar czf $O/r41c.tar.gz -C /tmp r41c
