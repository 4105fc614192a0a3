"""Time to first byte through the gateway vs the gRPC client's time to first audio, one stream.

``qwen3-tts-bench-gateway`` (also ``python benchmark/benchmark_gateway.py``). Needs a running
server and gateway (``qwen3-tts-serve`` starts both; ``scripts/gpu_e2e_bench.sh`` stage
``gateway`` on the GPU machine).

Requests alternate, one at a time: a gRPC request (``tools/client.py`` ``StreamingClient``: send ->
first non-empty audio chunk, the TTFA of ``qwen3-tts-bench-service``), then the same request as
``POST /v1/audio/speech`` to the gateway (before the request is written -> first body byte
received, over a kept-alive HTTP/1.1 connection, read with the standard library's ``http.client``),
for each ``--formats`` value in turn. Alternation spreads any drift of the server over both
paths. Same text, speaker, seed and ``max_frames`` for both; ``--warmup`` pairs are not measured.

Prints, per path, mean/p50/p95 in ms and the gateway's p50/p95 minus the gRPC one (the gateway's
cost: one more hop, JSON parsing, resampling, encoding); ``--out-json`` writes them with every
sample.

    qwen3-tts-bench-gateway --grpc-url 127.0.0.1:8001 --gateway-url http://127.0.0.1:8080 \\
        --requests 50 --warmup 5 --max-frames 50 --formats pcm wav mp3 --out-json gateway.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
import urllib.parse
from typing import Dict, List, Optional

from triton_qwen3_tts.tools.bench_metrics import summarize

__all__ = ["main", "gateway_ttfb", "compare"]


class HttpTtfb:
    """Time to first body byte of ``POST /v1/audio/speech`` on one kept-alive connection."""

    def __init__(self, url: str, timeout: float = 120.0):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.timeout = u.hostname, u.port or 80, timeout
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, body: Dict[str, object]) -> tuple:
        """(seconds to the first body byte, total body bytes); raises on an error status."""
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/audio/speech", body=data, headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"gateway answered {r.status}: {r.read().decode('utf-8', 'replace')}")
        first = r.read1(65536)
        ttfb = time.perf_counter() - t0
        n = len(first)
        while True:
            b = r.read1(65536)
            if not b:
                break
            n += len(b)
        return ttfb, n

    def close(self) -> None:
        self.conn.close()


def gateway_ttfb(url: str, body: Dict[str, object]) -> float:
    c = HttpTtfb(url)
    try:
        return c.request(body)[0]
    finally:
        c.close()


def compare(grpc: List[float], gateway: List[float]) -> Dict[str, Optional[float]]:
    """Summaries in ms and the gateway's extra time at p50 and p95."""
    g, w = summarize(grpc), summarize(gateway)

    def ms(d):
        return {k: (v if k == "n" or v is None else v * 1000.0) for k, v in d.items()}

    g, w = ms(g), ms(w)
    return {
        "grpc_ttfa_ms": g,
        "gateway_ttfb_ms": w,
        "delta_p50_ms": None if g["p50"] is None or w["p50"] is None else w["p50"] - g["p50"],
        "delta_p95_ms": None if g["p95"] is None or w["p95"] is None else w["p95"] - g["p95"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="qwen3-tts-bench-gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--grpc-url", default="127.0.0.1:8001")
    p.add_argument("--gateway-url", default="http://127.0.0.1:8080")
    p.add_argument("--requests", type=int, default=30, help="measured pairs per format (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured pairs first (default 3)")
    p.add_argument("--text", default="Hello there, this is a short sentence to measure the first audio.")
    p.add_argument("--speaker", default=None, help="preset speaker (default: the server's)")
    p.add_argument("--max-frames", type=int, default=50, help="max_frames of every request (default 50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--formats", nargs="+", default=["pcm"], help="gateway response_format values (default pcm)")
    p.add_argument("--sample-rate", type=int, default=24000, help="gateway sample_rate (default 24000)")
    p.add_argument("--out-json")
    a = p.parse_args(argv)
    from triton_qwen3_tts.tools.client import StreamingClient, build_inputs

    common = dict(text=a.text, seed=a.seed, max_frames=a.max_frames)
    if a.speaker:
        common["speaker"] = a.speaker
    grpc = StreamingClient(a.grpc_url)
    http_c = HttpTtfb(a.gateway_url)
    results = {}
    try:
        for fmt in a.formats:
            body = {"model": "qwen3-tts", "input": a.text, "response_format": fmt, "sample_rate": a.sample_rate}
            body.update(seed=a.seed, max_frames=a.max_frames)
            if a.speaker:
                body["voice"] = a.speaker
            g_s, w_s = [], []
            for i in range(a.warmup + a.requests):
                t0 = time.perf_counter()
                r = grpc.receive(grpc.send(build_inputs(**common)), t0, 300)
                ttfb, _ = http_c.request(body)
                if i >= a.warmup:
                    g_s.append(r.ttfa)
                    w_s.append(ttfb)
            results[fmt] = dict(compare(g_s, w_s), grpc_s=g_s, gateway_s=w_s)
            c = results[fmt]
            print(
                f"{fmt:5s} gRPC TTFA p50 {c['grpc_ttfa_ms']['p50']:.1f} p95 {c['grpc_ttfa_ms']['p95']:.1f} ms | "
                f"gateway TTFB p50 {c['gateway_ttfb_ms']['p50']:.1f} p95 {c['gateway_ttfb_ms']['p95']:.1f} ms | "
                f"delta p50 {c['delta_p50_ms']:+.1f} p95 {c['delta_p95_ms']:+.1f} ms ({a.requests} pairs)",
                flush=True,
            )
    finally:
        http_c.close()
        grpc.close()
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump({"config": vars(a), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
