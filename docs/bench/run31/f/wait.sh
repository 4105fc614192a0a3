#!/usr/bin/env bash
# run 31f, second call: waits for the soak r31f_start.sh started and collects it
export OUT=$OUT MODE=soak-wait TAG=soak31f
bash scripts/gpu_stability.sh 2>&1 | tail -45
