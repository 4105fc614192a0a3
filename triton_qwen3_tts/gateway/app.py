"""The FastAPI application of the gateway (a thin layer over the pure modules).

Endpoints (docs/design/gateway.md): ``POST /v1/audio/speech``, ``GET|POST /v1/audio/voices``,
``DELETE /v1/audio/voices/{id}``, ``GET /health``, ``GET /ready``. Every error is an OpenAI error
body (:mod:`.errors`).

Streaming: the handler waits for the first audio chunk before it answers, so an error the server
sends before any audio (a refused input, a full server) is an HTTP error status; after that, audio
bytes go out as each chunk arrives. When the HTTP client goes away, the `tts` request is cancelled
(its gRPC stream is cancelled; Triton cancels the request).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from typing import Optional

import anyio
import numpy as np
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from triton_qwen3_tts.gateway.audio import Resampler, make_encoder
from triton_qwen3_tts.gateway.errors import ApiError, bad_request
from triton_qwen3_tts.gateway.speech import parse_speech, tts_inputs
from triton_qwen3_tts.gateway.upstream import Upstream
from triton_qwen3_tts.gateway.voices import VoiceStore, decode_clip

__all__ = ["create_app"]

log = logging.getLogger("triton_qwen3_tts.gateway")
FIRST_CHUNK_POLL_S = 0.1  # how often a request waiting for its first chunk checks for a disconnect


class _CancellableStream(StreamingResponse):
    """A streaming response that notices a client disconnect at once (it listens for it, whatever
    the ASGI version) and calls ``on_close`` in every case: the upstream request is cancelled
    unless it finished."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away while we sent
                        pass
                    finally:
                        tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self._on_close()


class CheckpointInfo:
    """What the gateway knows of the served checkpoint: its task type and preset speakers (read
    from the checkpoint's config.json when the gateway can see the server's checkpoint folder)."""

    def __init__(self, task_type: Optional[str] = None, speakers=(), default_speaker: Optional[str] = None):
        self.task_type, self.speakers, self.default_speaker = task_type, tuple(speakers), default_speaker

    @classmethod
    async def from_server(cls, upstream: Upstream) -> "CheckpointInfo":
        from triton_qwen3_tts.model.config import Qwen3TTSConfig

        params = await upstream.model_parameters()
        ckpt = params.get("checkpoint", "")
        try:
            cfg = Qwen3TTSConfig.from_file(os.path.join(ckpt, "config.json"))
            return cls(cfg.task_type, cfg.speakers, params.get("default_speaker") or None)
        except Exception:  # noqa: BLE001 - a remote server's checkpoint: voices map by the store
            return cls(None, (), params.get("default_speaker") or None)


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def create_app(triton_url: str, voices_dir: str, model: str = "tts") -> FastAPI:
    """The gateway for the `tts` model ``model`` at gRPC ``triton_url``; voices under ``voices_dir``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await app.state.upstream.close()

    app = FastAPI(title="triton-qwen3-tts gateway", version="1", lifespan=lifespan)
    app.state.upstream = Upstream(triton_url, model)
    app.state.voices = VoiceStore(voices_dir)
    app.state.info = None
    for skipped in app.state.voices.skipped:
        log.warning("voice store: skipped %s", skipped)

    async def info() -> CheckpointInfo:
        if app.state.info is None:
            try:
                app.state.info = await CheckpointInfo.from_server(app.state.upstream)
            except Exception as e:  # noqa: BLE001 - the server is not up (yet)
                raise ApiError(503, f"the server is not available: {e}", None, "UNAVAILABLE") from None
        return app.state.info

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        errs = e.errors()
        loc = [str(x) for x in (errs[0].get("loc", ()) if errs else ()) if x not in ("body", "form", "query", "path")]
        param = loc[0] if loc else None
        msg = errs[0].get("msg", "invalid request") if errs else "invalid request"
        return _error(ApiError(422, f"{param}: {msg}" if param else msg, param, "invalid_request"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        return _error(ApiError(e.status_code, str(e.detail), None, "not_found" if e.status_code == 404 else None))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if await app.state.upstream.ready():
            return {"status": "ready"}
        raise ApiError(503, f"the server at {triton_url} is not ready", None, "UNAVAILABLE")

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        try:
            body = await request.json()
        except Exception:  # noqa: BLE001
            raise ApiError(400, "the request body is not valid JSON", None, "invalid_json") from None
        req = parse_speech(body)
        stored = app.state.voices.get(req.voice) if req.voice and not req.speaker else None
        presets = True
        if stored is None and req.voice and not req.speaker:
            ck = await info()
            presets = ck.task_type != "VoiceDesign"  # there, instructions describe the voice
            if ck.task_type == "Base":
                known = ", ".join(v.id for v in app.state.voices.list()) or "none"
                raise bad_request("voice", f"unknown voice {req.voice!r}; stored voices: {known}", "voice_not_found")
            elif presets and ck.speakers and req.voice.lower() not in ck.speakers:
                raise bad_request(
                    "voice", f"{req.voice!r} is not a voice of this checkpoint; allowed: {', '.join(ck.speakers)}"
                )
        upstream = app.state.upstream.synthesize(tts_inputs(req, stored, presets))
        chunks = upstream.__aiter__()
        resampler, encoder = None, None

        # the first chunk before the answer: an early error is an HTTP status
        first_task = asyncio.ensure_future(chunks.__anext__())
        try:
            while True:
                done, _ = await asyncio.wait({first_task}, timeout=FIRST_CHUNK_POLL_S)
                if done:
                    break
                if await request.is_disconnected():
                    first_task.cancel()
                    upstream.cancel()
                    raise ApiError(499, "the client closed the request", None, "CANCELLED")
            first = first_task.result()
        except StopAsyncIteration:
            first = None
        except BaseException:
            upstream.cancel()
            raise
        in_rate = first[1] if first else 24000
        resampler = Resampler(in_rate, req.sample_rate)
        encoder = make_encoder(req.response_format, req.sample_rate)
        t0 = time.perf_counter()

        async def audio_bytes():
            samples = 0
            if first is not None:
                samples += first[0].size
                yield encoder.encode(resampler.process(first[0]))
                async for audio, _rate in chunks:
                    samples += audio.size
                    b = encoder.encode(resampler.process(audio))
                    if b:
                        yield b
            tail = encoder.encode(resampler.process(np.zeros(0, np.float32), last=True)) + encoder.finish()
            if tail:
                yield tail
            log.info("speech: %.2f s of audio in %.2f s", samples / in_rate, time.perf_counter() - t0)

        async def sse():
            try:
                async for b in audio_bytes():
                    if b:
                        ev = {"type": "speech.audio.delta", "audio": base64.b64encode(b).decode("ascii")}
                        yield f"data: {json.dumps(ev)}\n\n"
                done = {
                    "type": "speech.audio.done",
                    "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
                }
                yield f"data: {json.dumps(done)}\n\n"
            except ApiError as e:
                yield f"data: {json.dumps({'type': 'error', **e.body()})}\n\n"

        def on_close() -> None:
            upstream.cancel()
            if hasattr(encoder, "close"):
                encoder.close()

        if req.stream_format == "sse":
            return _CancellableStream(sse(), on_close, media_type="text/event-stream")
        return _CancellableStream(audio_bytes(), on_close, media_type=encoder.content_type)

    @app.get("/v1/audio/voices")
    async def list_voices():
        data = [v.describe() for v in app.state.voices.list()]
        try:
            ck = await info()
            data += [{"id": s, "object": "voice", "type": "preset"} for s in ck.speakers]
        except ApiError:
            pass
        return {"object": "list", "data": data}

    @app.post("/v1/audio/voices", status_code=201)
    async def add_voice(
        file: UploadFile = File(..., description="the reference clip (WAV, FLAC, Ogg, mp3, ...; 1-30 s)"),
        ref_text: Optional[str] = Form(
            None, description="its transcript (in-context cloning); without it x-vector only"
        ),
        id: Optional[str] = Form(None, description="the voice id (default: a new one)"),
        overwrite: bool = Form(False, description="replace a voice of this id"),
    ):
        ck = await info()
        if ck.task_type not in (None, "Base"):
            raise bad_request(
                "file", f"the served checkpoint is {ck.task_type}; voice cloning needs a Base checkpoint", "unsupported"
            )
        data = await file.read()
        audio, rate = await asyncio.to_thread(decode_clip, data, "file")
        voice = await asyncio.to_thread(app.state.voices.add, audio, rate, ref_text, id, overwrite)
        return voice.describe()

    @app.delete("/v1/audio/voices/{voice_id}")
    async def delete_voice(voice_id: str):
        if not await asyncio.to_thread(app.state.voices.delete, voice_id):
            raise ApiError(404, f"voice: no stored voice {voice_id!r}", "voice", "voice_not_found")
        return {"id": voice_id, "object": "voice", "deleted": True}

    return app
