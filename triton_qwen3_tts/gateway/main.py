"""``qwen3-tts-gateway``: serve the OpenAI-compatible HTTP API (:mod:`.app`) on uvicorn.

    qwen3-tts-gateway --triton-url 127.0.0.1:8001 --port 8080 --voices-dir ~/.cache/triton_qwen3_tts/voices

``qwen3-tts-serve`` starts it beside tritonserver (``--gateway-port``, default 8080).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main", "default_voices_dir"]


def default_voices_dir() -> str:
    """``$QWEN3_TTS_CACHE/voices``, else ``~/.cache/triton_qwen3_tts/voices``."""
    root = os.environ.get("QWEN3_TTS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "triton_qwen3_tts")
    return os.path.join(root, "voices")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="qwen3-tts-gateway",
        description="OpenAI-compatible speech API (/v1/audio/speech, /v1/audio/voices) in front of the tts model.",
    )
    p.add_argument("--triton-url", default="127.0.0.1:8001", help="the server's gRPC address (default 127.0.0.1:8001)")
    p.add_argument("--model", default="tts", help="the tts model's name (default tts)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 inside containers)")
    p.add_argument("--port", type=int, default=8080, help="(default 8080)")
    p.add_argument(
        "--voices-dir", default=None, help="the voice store folder (default $QWEN3_TTS_CACHE/voices or ~/.cache/...)"
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    a = p.parse_args(argv)
    try:
        import uvicorn

        from triton_qwen3_tts.gateway.app import create_app
    except ModuleNotFoundError as e:
        raise SystemExit(
            f"error: qwen3-tts-gateway needs {e.name}, part of the [gateway] extra: "
            "pip install 'triton-qwen3-tts[gateway]'"
        ) from None

    app = create_app(a.triton_url, a.voices_dir or default_voices_dir(), a.model)
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
