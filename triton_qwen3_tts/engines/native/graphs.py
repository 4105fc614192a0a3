"""CUDA graphs of the native engine's decode and prefill steps, one per bucket."""

from __future__ import annotations

import time
from typing import Dict

import torch


from triton_qwen3_tts.engines.native.model import NativeModel


class _Graphs:
    """CUDA graphs keyed by tuples (a decode step per ``(B, C, top_p)``, a prefill per
    ``("prefill", P, L)``), all sharing one memory pool: every graph writes its results to
    static buffers allocated outside the pool, and replays never overlap (one stream)."""

    def __init__(self, model: NativeModel):
        self.model = model
        self.graphs: Dict[tuple, "torch.cuda.CUDAGraph"] = {}
        self.pool = None

    @torch.inference_mode()
    def capture(self, fn, keys, order=None) -> float:
        """Warm up (twice; compiles, cuBLAS handles, allocator) and capture ``fn(*key)`` for every
        key, largest first (``order``: the sort key) so later graphs reuse the pool."""
        t0 = time.perf_counter()
        m = self.model
        stream = torch.cuda.Stream(device=m.device)
        stream.wait_stream(torch.cuda.current_stream(m.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                for k in keys:
                    fn(*k)
        torch.cuda.current_stream(m.device).wait_stream(stream)
        torch.cuda.synchronize(m.device)
        for k in sorted(keys, key=order or (lambda k: tuple(-x for x in k))):
            g = torch.cuda.CUDAGraph()
            # The capture stream is this model's: torch.cuda.graph's default is one stream per
            # process, made on whichever device captured first, so a second GPU's engine would
            # capture on the first GPU's stream. thread_local: other threads of the process (the
            # other GPUs' engines) may make CUDA calls while this thread captures.
            with torch.cuda.graph(g, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                fn(*k)
            if self.pool is None:
                self.pool = g.pool()
            self.graphs[k] = g
        torch.cuda.synchronize(m.device)
        m.reset_all()  # warm-up mutated the state tables
        return time.perf_counter() - t0

    def replay(self, key) -> None:
        self.graphs[key].replay()
