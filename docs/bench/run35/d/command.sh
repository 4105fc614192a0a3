#!/usr/bin/env bash
# run 35d: a 2-minute soak at 60 req/s (4-s clips, up to 128 streams) of the recommended GPU
# configuration with chunk_frames 16 (ramp 2,4,8,16), main 0623cea, H200, same machine as 35c.
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
export OUT=$OUT SOAK_RPS=60 SOAK_MIN=2 STREAMS=128 TAG=soak35d
export REPO_ARGS="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 16 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
MODE=soak-start timeout 240 bash scripts/gpu_stability.sh 2>&1 | tail -8
W=/tmp/stability
for i in $(seq 1 200); do [ -f $W/soak.rc ] && break; sleep 1; done
echo "soak exit $(cat $W/soak.rc 2>/dev/null) at $(( $(date +%s) - T0 ))s"; cp $W/soak.txt $W/soak.json $OUT/ 2>/dev/null; tail -8 $W/soak.txt
ps -eo pid,args | awk '/[t]riton_python_backend_stub/ {print $1, $(NF-1)}'
grep -h "fused pipeline gpu" $W/server.log | tail -1 | cut -c1-600
MODE=soak-wait timeout 100 bash scripts/gpu_stability.sh 2>&1 | tail -25
pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
echo "done at $(( $(date +%s) - T0 ))s"
