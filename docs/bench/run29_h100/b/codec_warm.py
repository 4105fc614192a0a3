"""Diagnostic (run 29b): how long each (batch, frames) slot of the fused pipeline's stateful codec
takes to warm up and capture with codec_compile, and its replay time."""
import sys, time
import torch
from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
from triton_qwen3_tts.serving.codec.graphs import StatefulGraphRunner, batch_buckets_for
from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder
from triton_qwen3_tts.serving.talker.fused import frame_buckets

compile_ = sys.argv[2] == "compile"
dev = torch.device("cuda")
dec, _ = load_codec_decoder(sys.argv[1], dev, torch.bfloat16)
sd = StatefulCodecDecoder(dec).eval()
fb = frame_buckets(2, (2, 4, 8, 16), 25)
bb = batch_buckets_for(32)
r = StatefulGraphRunner(sd, dev, torch.bfloat16, bb, fb, compile=compile_)
torch.backends.cudnn.benchmark = compile_
t00 = time.time()
for b in (32, 1, 8, 2, 4, 16):
    for t in fb:
        t0 = time.time()
        slot = r._slot(b, t)
        torch.cuda.synchronize()
        cap = time.time() - t0
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        for _ in range(3):
            slot.graph.replay()
        ev[0].record()
        for _ in range(20):
            slot.graph.replay()
        ev[1].record(); torch.cuda.synchronize()
        ms = ev[0].elapsed_time(ev[1]) / 20
        print(f"{'compile' if compile_ else 'plain'} b={b:2d} t={t:2d}: warm+capture {cap:6.1f} s, replay {ms:7.3f} ms, "
              f"{b * t * 0.08 / ms * 1000:7.0f} audio-s/s, total {time.time() - t00:6.1f} s", flush=True)
