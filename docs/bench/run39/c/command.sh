#!/usr/bin/env bash
# run 39c: end to end with the codec's vocoder channels-last (codec_channels_last true, the new default),
# run 38e's configuration otherwise (fused pipeline, 16-frame chunks with
# ramp 2,4,8,16, 128 slots): closed loop at 1 and 64 streams of 200 frames, open loop at 60 and
# 70 req/s (4-s clips).
O=$OUT; export OUT=/tmp/r39c; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
export PER_RATE=1 OPEN_TIMEOUT=60 READY_S=420 SERVICE_ARGS="--duration 30 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 128"
{
  echo "== e2e $(date +%T)"
  LEVELS="1 64" RATES="60 70" STAGES=service TAG=e2e REPO_ARGS="$R" timeout 560 bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "^open loop;\|level    ok" | tail -40
grep -h "fused pipeline gpu" $OUT/server_e2e.log 2>/dev/null | tail -1 | cut -c1-300
gzip -f $OUT/server_*.log 2>/dev/null
tar czf $O/r39c.tar.gz -C /tmp r39c
