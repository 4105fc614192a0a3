#!/usr/bin/env bash
# run 33d: a 2-minute soak at 45 req/s (4-s clips, up to 128 streams) of the recommended GPU
# configuration with 128 slots (pipeline fused, compiled engine, native_kernels auto, codec
# compiled), on main with the engine's GPU timing; start and wait in one call (the soak's
# output is copied out before the server's shutdown and collection, in case the call is cut)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
export OUT=$OUT SOAK_RPS=45 SOAK_MIN=2 STREAMS=128 TAG=soak33d
export REPO_ARGS="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
MODE=soak-start timeout 320 bash scripts/gpu_stability.sh 2>&1 | tail -8
W=/tmp/stability
for i in $(seq 1 200); do [ -f $W/soak.rc ] && break; sleep 1; done
echo "soak exit $(cat $W/soak.rc 2>/dev/null)"; cp $W/soak.txt $W/soak.json $OUT/ 2>/dev/null; tail -8 $W/soak.txt
ps -eo pid,args | awk '/[t]riton_python_backend_stub/ {print $1, $(NF-1)}'
grep -h "fused pipeline gpu" $W/server.log | tail -1 | cut -c1-2500
MODE=soak-wait timeout 100 bash scripts/gpu_stability.sh 2>&1 | tail -25
