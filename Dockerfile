# syntax=docker/dockerfile:1
# triton-qwen3-tts, CUDA 13 image (host driver R580 or newer). See docs/docker.md.
#   docker build -t triton-qwen3-tts:cu13 .
#   docker run --gpus all --shm-size 2g -p 8000-8002:8000-8002 -p 8080:8080 -v $PWD/ckpt:/models/checkpoint:ro \
#       -v qwen3-tts-cache:/cache triton-qwen3-tts:cu13
# Triton 26.02: CUDA 13.1.1, TensorRT 10.15.1, Ubuntu 24.04, Python 3.12.
FROM nvcr.io/nvidia/tritonserver:26.02-py3

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1

# TensorRT's Python bindings, the same version as the image's libnvinfer (the export step builds
# the codec plan with them); soundfile needs libsndfile (Ubuntu's, as the base release has it).
# hadolint ignore=DL3008
RUN TRT_DEB="$(dpkg-query -W -f='${Version}' libnvinfer10)" \
    && apt-get update \
    && apt-get install -y --no-install-recommends "python3-libnvinfer=${TRT_DEB}" libsndfile1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/triton-qwen3-tts
COPY requirements/docker-cu13.txt requirements/cpu-2-stub.txt requirements/
# Ordered install (no single resolution exists; docs/environment.md, docs/docker.md):
#  1. vllm==0.32.0 with torch==2.13.0 (PyPI's CUDA 13.0 build) and the serving/export tools;
#  2. numpy<2 (+ opencv-python-headless<4.13) for the Triton python-backend stub.
RUN python3 -m pip install -r requirements/docker-cu13.txt \
    && python3 -m pip install --no-warn-conflicts -r requirements/cpu-2-stub.txt

COPY pyproject.toml README.md ./
COPY triton_qwen3_tts/ triton_qwen3_tts/
COPY model_repository/ model_repository/
COPY export/ export/
COPY scripts/ scripts/
COPY benchmark/ benchmark/
COPY docker/entrypoint.sh /usr/local/bin/qwen3-tts-entrypoint
# --no-deps: the requirements above are the whole environment; a re-resolution would pull numpy 2.
RUN python3 -m pip install --no-deps . \
    && chmod +x /usr/local/bin/qwen3-tts-entrypoint \
    && python3 -c "import numpy, torch, vllm, transformers, tensorrt, onnxruntime, polygraphy, tritonclient.grpc, av, fastapi, uvicorn, multipart, triton_qwen3_tts.gateway.app; \
assert numpy.__version__.startswith('1.'), numpy.__version__; \
assert (torch.version.cuda or '').startswith('13'), torch.version.cuda; \
print('image ok: torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'tensorrt', tensorrt.__version__)"

# The compiled kernels (torch.compile's inductor, the native engine's Triton kernels) are cached in
# the volume too, so that a restarted container can reuse them.
ENV QWEN3_TTS_CHECKPOINT=/models/checkpoint \
    QWEN3_TTS_CACHE=/cache \
    HF_HOME=/cache/huggingface \
    TORCHINDUCTOR_CACHE_DIR=/cache/torchinductor \
    TRITON_CACHE_DIR=/cache/triton
VOLUME ["/cache"]
# 8000-8002: Triton HTTP, gRPC, metrics; 8080: the OpenAI-compatible gateway (/v1/audio/speech)
EXPOSE 8000 8001 8002 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen(\"http://127.0.0.1:8000/v2/health/ready\", timeout=4)"]
ENTRYPOINT ["/usr/local/bin/qwen3-tts-entrypoint"]
