#!/usr/bin/env bash
# run 30f: 30e again (same command) on the code with the codec state moved in one copy each way (step_pool)
# (prompt_device auto, engine_cpu_threads 0, fused_ride_along due): closed 1/32/64 with 30-s
# levels (more one-stream requests for its p95), open 20/30/40 req/s
O=$OUT; export OUT=/tmp/r30f; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton --codec-compile true"
export SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=300 LEVELS="1 32 64" RATES="20 30 40"
{
  echo "== cc $(date +%T)"
  STAGES=service TAG=cc REPO_ARGS="$R" timeout 570 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -30
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -2 | cut -c1-700
tar czf $O/r30f.tar.gz -C /tmp r30f
