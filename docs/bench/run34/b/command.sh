#!/usr/bin/env bash
# run 34b: (1) a 2-minute soak at 50 req/s (4-s clips, up to 128 streams) of the recommended GPU
# configuration with 128 slots on main, whose default path now takes the first chunk's last
# frame on the device; (2) scripts/stream_overlap_probe.py: would codec calls hide behind talker
# steps on a second, lower-priority CUDA stream (compile caches warm from the server)
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
export OUT=$OUT SOAK_RPS=50 SOAK_MIN=2 STREAMS=128 TAG=soak34b
export REPO_ARGS="--native-batch-buckets 1,8,32,64,128 --max-num-seqs 128 --max-in-flight 128 --max-queued 128 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
MODE=soak-start timeout 320 bash scripts/gpu_stability.sh 2>&1 | tail -8
W=/tmp/stability
for i in $(seq 1 200); do [ -f $W/soak.rc ] && break; sleep 1; done
echo "soak exit $(cat $W/soak.rc 2>/dev/null) at $(( $(date +%s) - T0 ))s"; cp $W/soak.txt $W/soak.json $OUT/ 2>/dev/null; tail -8 $W/soak.txt
ps -eo pid,args | awk '/[t]riton_python_backend_stub/ {print $1, $(NF-1)}'
grep -h "fused pipeline gpu" $W/server.log | tail -1 | cut -c1-2500
MODE=soak-wait timeout 100 bash scripts/gpu_stability.sh 2>&1 | tail -25
pkill -KILL -f '^tritonserver'; pkill -KILL -f 'python_backend_stub'
left=$(( 585 - ($(date +%s) - T0) ))
echo "== probe $(date +%T) left ${left}s"
source scripts/gpu_env.sh > /dev/null 2>&1
timeout $((left > 30 ? left - 15 : 15)) python scripts/stream_overlap_probe.py --preset 1.7b-customvoice --batch 32 64 \
  --calls 2x2 8x25 32x25 --compile --codec-compile --json $OUT/stream_overlap.json > $OUT/stream_overlap.txt 2>&1
echo "probe exit $?"; grep -v "^W1\|warn" $OUT/stream_overlap.txt | tail -30
