#!/usr/bin/env bash
# run 30b: A/B on one H100: "base" = the prompt projected on the CPU with a torch thread per core
# (prompt_device cpu, engine_cpu_threads 16: the code before cc9e007 and d095715) against "new"
# = the defaults (prompt_device auto: on the engine's GPU; engine_cpu_threads 0: 4 threads);
# the recommended configuration without the codec's compile, closed 1/32/64, open 20/30/40 each
O=$OUT; export OUT=/tmp/r30b; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
R="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton"
export SERVICE_ARGS="--duration 12 --warmup 1" OPEN_ARGS="--duration 12 --warmup 2 --streams 64" OPEN_TIMEOUT=70 READY_S=200 LEVELS="1 32 64" RATES="20 30 40"
run() {  # TAG, extra repo args, limit s
  echo "== $1 $(date +%T) limit $3 s"
  STAGES=service TAG=$1 REPO_ARGS="$R $2" timeout "$3" bash scripts/gpu_e2e_bench.sh
  echo "exit $? $(date +%T)"
  pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'; sleep 2
}
{
  run base "--prompt-device cpu --engine-cpu-threads 16" 320
  run new "" $((580 - SECONDS))
} > $OUT/console.txt 2>&1
grep -v "^ *$" $OUT/console.txt | grep -v "mean     p50" | grep -v "^closed loop;\|^open loop;\|level    ok" | tail -40
grep -h "fused pipeline gpu" $OUT/server_*.log | tail -2 | cut -c1-700
tar czf $O/r30b.tar.gz -C /tmp r30b
