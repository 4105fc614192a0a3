"""Client for the `tts` model: gRPC bidirectional streaming (default) or HTTP ``generate_stream``.

    qwen3-tts-client --text "Hello there." --out out.wav
    qwen3-tts-client --text "..." --speaker eric --language chinese --http
    # Base checkpoints: clone a voice (in-context), store it as "anna", then reuse it by id alone
    qwen3-tts-client --text "..." --ref-audio anna.wav --ref-text "..." --voice-id anna
    qwen3-tts-client --text "..." --voice-id anna

(``qwen3-tts-client`` is ``python -m triton_qwen3_tts.tools.client``.)

Prints the time to first audio (send -> first non-empty chunk) and the real-time factor
(wall time / audio duration). The library functions are used by the benchmarks and system tests.
"""

from __future__ import annotations

import argparse
import functools
import json
import queue
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

SAMPLE_RATE = 24000

# client-side name -> (Triton datatype, numpy dtype); BYTES inputs are UTF-8 strings
_INPUT_TYPES = {
    "text": "BYTES",
    "task_type": "BYTES",
    "speaker": "BYTES",
    "language": "BYTES",
    "instruct": "BYTES",
    "ref_audio": "FP32",
    "ref_sample_rate": "INT32",
    "ref_text": "BYTES",
    "x_vector_only": "BOOL",
    "voice_id": "BYTES",
    "replace_voice": "BOOL",
    "sample_format": "BYTES",
    "sample_rate": "INT32",
    "stream": "BOOL",
    "temperature": "FP32",
    "top_k": "INT32",
    "top_p": "FP32",
    "repetition_penalty": "FP32",
    "subtalker_temperature": "FP32",
    "subtalker_top_k": "INT32",
    "subtalker_top_p": "FP32",
    "seed": "INT64",
    "max_frames": "INT32",
    "ignore_eos": "BOOL",
}
_NP = {"BYTES": object, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}


class TtsError(RuntimeError):
    """The request failed. For an error the server answered, ``code`` is the Triton error code
    name the `tts` model put in front of its message (``INVALID_ARG``, ``UNAVAILABLE``,
    ``CANCELLED``, ``INTERNAL``): streaming responses carry only a message, so the model writes
    the code into it. ``code`` is None for a server message without one."""

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        m = re.search(
            r"\[(INVALID_ARG|UNAVAILABLE|CANCELLED|INTERNAL|NOT_FOUND|UNSUPPORTED|ALREADY_EXISTS|UNKNOWN)\]", message
        )
        self.code = code or (m.group(1) if m else None)


class TransportError(TtsError):
    """No complete answer came back: the connection could not be made or broke (``code``
    ``CONNECTION``), or the client cancelled the request (``CANCELLED``)."""


@dataclass
class Synthesis:
    audio: np.ndarray  # float32 or int16, as requested
    sample_rate: int
    ttfa: Optional[float]  # seconds from send to first non-empty chunk
    total: float  # seconds from send to the final response
    chunks: List[tuple] = field(default_factory=list)  # (arrival seconds, samples) per chunk

    @property
    def duration(self) -> float:
        return self.audio.shape[0] / float(self.sample_rate)

    @property
    def rtf(self) -> float:
        return self.total / self.duration if self.duration else float("inf")


def _array(name: str, value: Any) -> np.ndarray:
    dt = _INPUT_TYPES[name]
    if dt == "BYTES":
        return np.array([str(value).encode("utf-8")], dtype=object)
    if name == "ref_audio":  # mono samples in [-1, 1]; int16 PCM is scaled
        a = np.asarray(value)
        if a.ndim == 2 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 1:
            raise ValueError(f"ref_audio must be mono [samples], got shape {list(a.shape)} (mix the channels first)")
        if a.dtype == np.int16:
            return a.astype(np.float32) / 32768.0
        return a.astype(np.float32)
    return np.array([value], dtype=_NP[dt])


def build_inputs(**kw) -> Dict[str, np.ndarray]:
    unknown = set(kw) - set(_INPUT_TYPES)
    if unknown:
        raise ValueError(f"unknown input(s) {sorted(unknown)}; known: {', '.join(_INPUT_TYPES)}")
    return {k: _array(k, v) for k, v in kw.items() if v is not None}


class StreamingClient:
    """Send requests to the `tts` model over gRPC streaming and collect each one's responses.

    Every request gets a gRPC stream of its own (its own tritonclient ``InferenceServerClient``),
    so each response and each stream failure belongs to exactly one request, and one request can
    be cancelled on the server (:meth:`cancel`) without touching the others. Requests cannot share
    a stream: the server puts the request id into an error response, but tritonclient's stream
    callback receives only ``InferenceServerException(msg=error_message)`` and drops the response
    that holds the id, so an error on a shared stream could belong to any pending request.
    gRPC carries all these streams over one connection (channels with the same target and
    arguments share it).

    ``queues[rid]`` receives ``(result, error, arrival time)`` for every response of request
    ``rid``; :meth:`receive` consumes it. Safe to use from several threads.
    """

    def __init__(self, url: str = "127.0.0.1:8001", model: str = "tts"):
        import tritonclient.grpc as grpcclient

        self._g = grpcclient
        self.url = url
        self.model = model
        self.queues: Dict[str, "queue.Queue"] = {}
        self._streams: Dict[str, Any] = {}  # request id -> its InferenceServerClient, until closed
        self._lock = threading.Lock()
        # The per-request channels share a connection only while some channel holds it: this
        # client's one call opens it and holding the client keeps it open between requests
        # (otherwise each request after an idle moment would connect anew). A failure here is
        # not reported: each request reports its own connection failure through receive().
        self._anchor = grpcclient.InferenceServerClient(url)
        try:
            self._anchor.is_server_live(client_timeout=5)
        except Exception:
            pass

    @property
    def in_flight(self) -> int:
        """Requests sent whose stream is still open (not yet received to the end, nor cancelled)."""
        return len(self._streams)

    def send(self, inputs: Dict[str, np.ndarray], request_id: Optional[str] = None) -> str:
        return self.send_raw({k: (v, _INPUT_TYPES[k]) for k, v in inputs.items()}, request_id)

    def send_raw(self, inputs: Dict[str, tuple], request_id: Optional[str] = None) -> str:
        """Send ``{name: (array, Triton datatype)}`` as given (no client-side checks) on a new
        stream; return the request id. A connection failure is not raised here: receive()
        reports it as the request's error."""
        from tritonclient.utils import InferenceServerException

        rid = request_id or uuid.uuid4().hex
        ins = []
        for name, (arr, dtype) in inputs.items():
            t = self._g.InferInput(name, list(arr.shape), dtype)
            t.set_data_from_numpy(arr)
            ins.append(t)
        q: "queue.Queue" = queue.Queue()
        with self._lock:
            if rid in self.queues:
                raise ValueError(f"request id {rid!r} is already in use")
            self.queues[rid] = q
            self._streams[rid] = client = self._g.InferenceServerClient(self.url)
        try:
            # the callback is bound to this request's queue: the stream carries nothing else
            client.start_stream(callback=functools.partial(self._deliver, q))
        except InferenceServerException as e:
            q.put(
                (
                    None,
                    TransportError(f"cannot open a gRPC stream to {self.url}: {e}", "CONNECTION"),
                    time.perf_counter(),
                )
            )
            return rid
        try:
            client.async_stream_infer(self.model, ins, request_id=rid, enable_empty_final_response=True)
        except InferenceServerException as e:
            # The stream failed before the request was queued on it (e.g. nothing listens at the
            # address): tritonclient marks the stream dead, then hands the cause (the gRPC status)
            # to the callback. Wait for that cause, so receive() reports it rather than this
            # "stream is no longer in valid state".
            try:
                item = q.get(timeout=10.0)
            except queue.Empty:
                item = (
                    None,
                    TransportError(f"gRPC stream to {self.url} failed: {e}", "CONNECTION"),
                    time.perf_counter(),
                )
            q.put(item)
        return rid

    @staticmethod
    def _deliver(q: "queue.Queue", result, error) -> None:
        # tritonclient's stream callback: a response (``result``), the error response of the
        # request (``error`` with no status) or the failure of the stream (``error`` whose status
        # is the gRPC status, e.g. "StatusCode.UNAVAILABLE"); runs on the stream's own thread.
        q.put((result, error, time.perf_counter()))

    def _error(self, error, answered: bool) -> TtsError:
        """The exception for an error taken from a request's queue; ``answered``: a response of the
        request arrived before it."""
        if isinstance(error, TtsError):  # put there by this class (send_raw, cancel)
            return error
        status = error.status() if hasattr(error, "status") else None
        msg = (error.message() if hasattr(error, "message") else None) or str(error)
        if status is None:  # the server's error response to this request
            return TtsError(msg)
        name = status.replace("StatusCode.", "")
        if name == "CANCELLED":
            return TransportError(f"request cancelled by the client: {msg}", "CANCELLED")
        if name == "UNAVAILABLE" and not answered:
            return TransportError(f"cannot connect to {self.url}: {msg}", "CONNECTION")
        return TransportError(f"gRPC stream to {self.url} failed ({name}): {msg}", "CONNECTION")

    def receive(self, rid: str, t_send: float, timeout: float = 300.0) -> Synthesis:
        """Collect request ``rid`` up to its final response. Raises :class:`TtsError` for the
        server's error response, :class:`TransportError` when the stream failed or the request was
        cancelled, ``queue.Empty`` when no response came within ``timeout`` seconds (per
        response). The request's stream is closed in every case; a request that did not finish
        (timeout, interrupt) is cancelled on the server: nobody could receive the rest of it."""
        q = self.queues[rid]
        chunks, parts, sr, ttfa = [], [], SAMPLE_RATE, None
        answered = finished = False
        try:
            while True:
                result, error, t = q.get(timeout=timeout)
                if error is not None:
                    # the server's error response is the request's last (the model flags it
                    # final); a failed stream carries nothing more: neither needs a cancel
                    finished = True
                    raise self._error(error, answered)
                answered = True
                resp = result.get_response()
                final = (
                    resp.parameters["triton_final_response"].bool_param
                    if "triton_final_response" in resp.parameters
                    else False
                )
                audio = result.as_numpy("audio")
                if audio is not None and audio.size:
                    if ttfa is None:
                        ttfa = t - t_send
                    parts.append(audio.reshape(-1))
                    chunks.append((t - t_send, audio.size))
                    s = result.as_numpy("sample_rate")
                    if s is not None:
                        sr = int(s.reshape(-1)[0])
                if final:
                    finished = True
                    total = t - t_send
                    break
        finally:
            self._close(rid, cancel=not finished)
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return Synthesis(audio, sr, ttfa, total, chunks)

    def synthesize(self, timeout: float = 300.0, **kw) -> Synthesis:
        t0 = time.perf_counter()
        rid = self.send(build_inputs(**kw))
        return self.receive(rid, t0, timeout)

    def cancel(self, rid: str) -> None:
        """Cancel request ``rid`` on the server (its stream is cancelled); a receive() waiting for
        it raises :class:`TransportError` with code ``CANCELLED``. Nothing for a closed request."""
        self._close(rid, cancel=True)

    def _close(self, rid: str, cancel: bool) -> None:
        with self._lock:
            client = self._streams.pop(rid, None)
            q = self.queues.pop(rid, None)
        if client is None:
            return
        self._close_stream(client, cancel)
        if cancel and q is not None:  # wake a receive() still waiting for the request
            q.put((None, TransportError("request cancelled by the client", "CANCELLED"), time.perf_counter()))

    @staticmethod
    def _close_stream(client, cancel: bool) -> None:
        # cancel=False waits until the server has finished the stream's request; best effort: a
        # failure to close must not hide the error that made the caller close
        try:
            client.stop_stream(cancel_requests=cancel)
            client.close()
        except Exception:
            pass

    def close(self, cancel: bool = False) -> None:
        """Close every request's open stream, then the connection. ``cancel=True`` cancels the
        requests in flight on the server; otherwise this waits until the server has finished
        them. Responses not received by then are dropped."""
        for rid in list(self._streams):
            self._close(rid, cancel)
        self._anchor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _http_error_message(err) -> str:
    """The server's message in an HTTP error response (``urllib.error.HTTPError``). Triton sends
    ``{"error": "..."}`` as JSON, or as a server-sent event (``data: {...}``) when the model's
    first response of a ``generate_stream`` is an error."""
    try:
        body = err.read().decode("utf-8", "replace")
    except Exception:
        body = ""
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and "error" in ev:
            return str(ev["error"])
    return f"HTTP {err.code} {err.reason}" + (f": {body.strip()}" if body.strip() else "")


def synthesize_http(url: str = "127.0.0.1:8000", model: str = "tts", timeout: float = 300.0, **kw) -> Synthesis:
    """Stream through Triton's HTTP ``generate_stream`` endpoint (server-sent events). Raises
    :class:`TtsError` for the server's error, :class:`TransportError` when the server cannot be
    reached or the connection breaks, ``TimeoutError`` after ``timeout`` seconds of silence."""
    import http.client
    import urllib.error
    import urllib.request

    body = {}
    for k, arr in build_inputs(**kw).items():
        v = arr.tolist()
        if _INPUT_TYPES[k] == "BYTES":
            v = [x.decode("utf-8") for x in v]
        body[k] = v if k == "ref_audio" else v[0]
    req = urllib.request.Request(
        f"http://{url}/v2/models/{model}/generate_stream",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    parts, chunks, ttfa, sr = [], [], None, SAMPLE_RATE
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                ev = json.loads(line[5:])
                if "error" in ev:
                    raise TtsError(ev["error"])
                t = time.perf_counter() - t0
                audio = np.asarray(ev.get("audio", []), dtype=np.float32).reshape(-1)
                if audio.size:
                    ttfa = t if ttfa is None else ttfa
                    parts.append(audio)
                    chunks.append((t, audio.size))
                if "sample_rate" in ev:
                    sr = int(np.asarray(ev["sample_rate"]).reshape(-1)[0])
    except urllib.error.HTTPError as e:  # an error status: the server's message is in the body
        raise TtsError(_http_error_message(e)) from None
    except urllib.error.URLError as e:  # no connection (refused, unknown host, connect timeout)
        if isinstance(e.reason, TimeoutError):
            raise TimeoutError(f"no answer from {url} within {timeout:g} s") from None
        raise TransportError(f"cannot connect to {url}: {e.reason}", "CONNECTION") from None
    except (http.client.HTTPException, ConnectionError) as e:  # the connection broke mid-stream
        raise TransportError(f"connection to {url} broke: {type(e).__name__}: {e}", "CONNECTION") from None
    total = time.perf_counter() - t0
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return Synthesis(audio, sr, ttfa, total, chunks)


def _allowed_values() -> Dict[str, Any]:
    """The values the server accepts for the official checkpoints (a checkpoint may define other
    speakers and languages: the server checks against its own and names them on refusal)."""
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.serving.model_config import TtsModelConfig
    from triton_qwen3_tts.serving.tts.request import SAMPLE_FORMATS, TASK_TYPES

    return {
        "default_sample_format": TtsModelConfig.default_sample_format,
        "task_type": list(TASK_TYPES),
        "sample_format": list(SAMPLE_FORMATS),
        "speaker": sorted(presets.SPEAKERS),
        # as Qwen3TTSConfig.supported_languages: "auto" plus the languages (dialects are implied
        # by a speaker, not selected)
        "language": ["auto"] + sorted(presets.LANGUAGES),
    }


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv=None) -> int:
    allowed = _allowed_values()
    p = argparse.ArgumentParser(
        prog="qwen3-tts-client",
        description="Synthesize speech with the triton-qwen3-tts service (start it with qwen3-tts-serve).",
        epilog="A server error is printed as one line 'error: ...' on stderr (exit status 1).",
    )
    p.add_argument("--text", required=True, help="what to say (UTF-8)")
    p.add_argument("--out", default="out.wav", help="output WAV (24 kHz unless --sample-rate)")
    p.add_argument("--url", default=None, help="server address (default 127.0.0.1:8001 gRPC, :8000 with --http)")
    p.add_argument("--http", action="store_true", help="use HTTP generate_stream instead of gRPC streaming")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each response (default 300)")
    p.add_argument(
        "--task-type",
        choices=allowed["task_type"],
        help="one of " + ", ".join(allowed["task_type"]) + " (default: the checkpoint's)",
    )
    # speakers and languages of the official checkpoints; the server checks against its own and
    # lists them when it refuses one
    p.add_argument(
        "--speaker", help="CustomVoice speaker: " + ", ".join(allowed["speaker"]) + " (default: the server's default)"
    )
    p.add_argument("--language", help="one of: " + ", ".join(allowed["language"]) + " (default auto)")
    p.add_argument("--instruct", help="VoiceDesign: the voice description; CustomVoice 1.7B: a style instruction")
    p.add_argument("--ref-audio", help="reference WAV for Base voice cloning")
    p.add_argument("--ref-text")
    p.add_argument("--x-vector-only", action="store_true")
    p.add_argument("--voice-id")
    p.add_argument(
        "--replace-voice",
        action="store_true",
        help="with --ref-audio and --voice-id: replace a voice stored under that id from other audio "
        "(without it the server refuses other audio for a stored id)",
    )
    p.add_argument(
        "--sample-format",
        choices=allowed["sample_format"],
        help="audio samples: "
        + " or ".join(allowed["sample_format"])
        + f" (default {allowed['default_sample_format']})",
    )
    p.add_argument(
        "--sample-rate", type=int, help="output rate in Hz, 8000-48000 (default 24000; the server resamples)"
    )
    p.add_argument("--no-stream", action="store_true", help="one response with the whole utterance")
    # the official generation controls (default: the checkpoint's generation_config.json)
    p.add_argument("--temperature", type=float, help="talker (codebook 0); 0 = greedy")
    p.add_argument("--top-k", type=int, help="talker top-k")
    p.add_argument("--top-p", type=float, help="talker top-p, in (0, 1]")
    p.add_argument("--repetition-penalty", type=float, help="on the codebook-0 codes already generated; 1 = off")
    p.add_argument(
        "--subtalker-temperature", type=float, help="code predictor (codebooks 1-15); default: --temperature"
    )
    p.add_argument("--subtalker-top-k", type=int, help="code predictor top-k; default: --top-k")
    p.add_argument("--subtalker-top-p", type=float, help="code predictor top-p; default: --top-p")
    p.add_argument("--seed", type=int)
    p.add_argument("--max-frames", type=int)
    p.add_argument("--ignore-eos", action="store_true", help="fixed length: always generate max_frames")
    a = p.parse_args(argv)
    kw = dict(
        text=a.text,
        task_type=a.task_type,
        speaker=a.speaker,
        language=a.language,
        instruct=a.instruct,
        ref_text=a.ref_text,
        voice_id=a.voice_id,
        sample_format=a.sample_format,
        sample_rate=a.sample_rate,
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        repetition_penalty=a.repetition_penalty,
        subtalker_temperature=a.subtalker_temperature,
        subtalker_top_k=a.subtalker_top_k,
        subtalker_top_p=a.subtalker_top_p,
        seed=a.seed,
        max_frames=a.max_frames,
    )
    if a.no_stream:
        kw["stream"] = False
    if a.x_vector_only:
        kw["x_vector_only"] = True
    if a.replace_voice:
        kw["replace_voice"] = True
    if a.ignore_eos:
        kw["ignore_eos"] = True
    if a.ref_audio:
        import soundfile as sf

        wav, sr = sf.read(a.ref_audio, dtype="float32", always_2d=True)
        kw["ref_audio"], kw["ref_sample_rate"] = wav.mean(axis=1), sr
    try:
        if a.http:
            res = synthesize_http(a.url or "127.0.0.1:8000", timeout=a.timeout, **kw)
        else:
            with StreamingClient(a.url or "127.0.0.1:8001") as c:
                res = c.synthesize(timeout=a.timeout, **kw)
    except (TtsError, ValueError) as e:  # the server's error, no connection, or an input refused here
        hint = ""
        if isinstance(e, TransportError) and e.code == "CONNECTION" and str(e).startswith("cannot connect"):
            hint = " (is the server running and ready? qwen3-tts-serve starts it and says when it is)"
        print(f"error: {_one_line(e)}{hint}", file=sys.stderr)
        return 1
    except (queue.Empty, TimeoutError):
        print(f"error: no response within {a.timeout:g} s", file=sys.stderr)
        return 1
    import soundfile as sf

    sf.write(a.out, res.audio, res.sample_rate)
    ttfa = f"{res.ttfa * 1000:.1f} ms" if res.ttfa is not None else "n/a"
    print(
        f"wrote {a.out}: {res.duration:.2f} s of audio in {len(res.chunks)} chunks; "
        f"time to first audio {ttfa}; total {res.total:.2f} s; real-time factor {res.rtf:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
