"""preStop hook of the qwen3-tts server container: let the streams in flight finish before the
server gets SIGTERM.

Kubernetes takes a terminating pod out of its Service's endpoints while this hook runs, so no new
stream should arrive after a short propagation delay; the streams already admitted keep going.
The hook waits ``--delay`` seconds (for that propagation), then reads the server's metrics until
the tts model's in-flight gauge (``qwen3_tts_requests_in_flight``, summed over every series: one
per tts instance, or per GPU) is 0, or ``--timeout`` seconds have passed. It always exits 0:
Kubernetes sends SIGTERM after the hook either way, and the launcher then stops tritonserver,
which gets ``--exit-timeout-secs`` for what is still running.

It runs in the server image, whose Python has prometheus_client (a vLLM requirement).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def in_flight(url: str, metric: str, timeout: float = 2.0) -> float:
    """The sum of ``metric``'s samples at ``url`` (0 when the server exports none yet)."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode("utf-8", "replace")
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric:
                total += sample.value
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--metrics-url", default="http://127.0.0.1:8002/metrics")
    p.add_argument("--metric", default="qwen3_tts_requests_in_flight")
    p.add_argument("--delay", type=float, default=5.0, help="seconds for endpoint removal to propagate")
    p.add_argument("--timeout", type=float, default=180.0, help="longest wait for the streams, after --delay")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between two reads of the metrics")
    a = p.parse_args(argv)
    time.sleep(a.delay)
    deadline = time.monotonic() + a.timeout
    while True:
        try:
            n = in_flight(a.metrics_url, a.metric)
        except OSError as e:  # the server is gone or not serving metrics: nothing to wait for
            print(f"drain: metrics unreadable ({e}); not waiting", file=sys.stderr, flush=True)
            return 0
        if n <= 0:
            print("drain: no stream in flight", flush=True)
            return 0
        if time.monotonic() >= deadline:
            print(f"drain: {n:g} streams still in flight after {a.timeout:g} s; stopping anyway", flush=True)
            return 0
        time.sleep(a.poll)


if __name__ == "__main__":
    sys.exit(main())
