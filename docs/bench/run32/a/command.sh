#!/usr/bin/env bash
# run 32a: a 6-minute soak at 20 req/s (4-s clips, up to 64 streams) of the recommended GPU
# configuration with native_kernels auto, the compiled codec and the overlapped engine loop
# (this call starts it; r32b_wait.sh collects it)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
export OUT=$OUT MODE=soak-start SOAK_RPS=20 SOAK_MIN=6 STREAMS=64 TAG=soak32a
export REPO_ARGS="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels auto --codec-compile true"
bash scripts/gpu_stability.sh 2>&1 | tail -20
