#!/usr/bin/env bash
# Codec measurements on the GPU machine (device tool): windowed vs stateful, fp32 and bf16,
# eager and CUDA graphs, plus the real-size decoder's window error. Results under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
for dt in float32 bfloat16; do
  python3 benchmark/benchmark_codec.py --device cuda --dtype $dt --batch 1 8 32 64 --backends eager graph \
     --modes windowed stateful --json "$OUT/codec_$dt.json" 2>&1 | tee "$OUT/codec_$dt.txt"
done
python3 - <<'PY' 2>&1 | tee "$OUT/window_error_real.txt"
import torch
from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import CodecDecoderConfig
from triton_qwen3_tts.model.codec import CodecDecoder, init_random_codec_weights, measure_window_error
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
cfg = CodecDecoderConfig.from_dict(presets.speech_tokenizer_config("1.7b-customvoice")["decoder_config"])
dec = init_random_codec_weights(CodecDecoder(cfg), 0).cuda().eval()
codes = torch.randint(0, 2048, (700, 16), generator=torch.Generator().manual_seed(0)).cuda()
with torch.inference_mode():
    y = dec.decode(codes[None, :50]); print("real decoder output rms", float(y.pow(2).mean().sqrt()))
    for ctx, err in measure_window_error(dec, codes, [0, 25, 48, 72, 96, 144, 300, 600]).items():
        print(f"real-size random decoder, fp32 (no TF32), 700 frames, last 25 decoded: left_context={ctx:4d} max_abs_error={err:.3e}")
PY
