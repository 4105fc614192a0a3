#!/usr/bin/env bash
# run 39b: the stateful codec's vocoder channels-last (codec_channels_last, the new default)
# against the reference layout: the 32 x 25 slot eager and compiled in its graph with kernel
# tables (codec_profile.py), then every slot of the compiled channels-last codec (codec_slots.py).
O=$OUT; export OUT=/tmp/r39b; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
{
  source scripts/gpu_env.sh
  echo "== profile channels-last $(date +%T)"
  timeout 170 python scripts/codec_profile.py --compile --json $OUT/codec_profile_cl.json
  echo "exit $? $(date +%T)"
  echo "== profile reference layout $(date +%T)"
  timeout 170 python scripts/codec_profile.py --compile --no-channels-last --json $OUT/codec_profile_ncl.json
  echo "exit $? $(date +%T)"
  echo "== slots channels-last $(date +%T)"
  timeout 200 python scripts/codec_slots.py --checkpoint $CKPT --compile --chunk-frames 25 --json $OUT/codec_slots_cl.json
  echo "exit $? $(date +%T)"
} > $OUT/console.txt 2>&1
grep -v "UserWarning\|_warn_once\|^W1\|warn_once" $OUT/console.txt | grep -v "^ *[0-9.]* *[0-9.]* *[0-9.]* *decoder\.\|^ *[0-9.]* *[0-9.]*  void\|^ *[0-9.]* *[0-9.]*  triton_\|^Conv\|^ *[0-9.]* *[0-9.]*  sm\|^ *[0-9.]* *[0-9.]*  cutlass\|^ *[0-9.]* *[0-9.]*  nvjet" | tail -80 | cut -c1-200
tar czf $O/r39b.tar.gz -C /tmp r39b
