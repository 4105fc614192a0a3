#!/usr/bin/env bash
# run 31f: an 8-minute soak at 20 req/s (4-s clips, up to 64 streams) of the recommended GPU
# configuration with the Triton kernels and the compiled codec (this call starts it; r31f_wait.sh
# collects it)
export OUT=$OUT MODE=soak-start SOAK_RPS=20 SOAK_MIN=8 STREAMS=64 TAG=soak31f
export REPO_ARGS="--native-batch-buckets 1,8,32,64 --pipeline fused --first-chunk-frames 2 --chunk-ramp 2,4,8,16 --chunk-frames 25 --codec-max-batch-size 32 --native-compile true --native-kernels triton --codec-compile true"
bash scripts/gpu_stability.sh 2>&1 | tail -20
