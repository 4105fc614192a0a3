"""Client for the `tts` model: gRPC bidirectional streaming (default) or HTTP ``generate_stream``.

    python -m qwen3_tts_triton.client --text "Hello there." --out out.wav
    python -m qwen3_tts_triton.client --text "..." --speaker eric --language chinese --http
    # Base checkpoints: clone a voice (in-context), store it as "anna", then reuse it by id alone
    python -m qwen3_tts_triton.client --text "..." --ref-audio anna.wav --ref-text "..." --voice-id anna
    python -m qwen3_tts_triton.client --text "..." --voice-id anna

Prints the time to first audio (send -> first non-empty chunk) and the real-time factor
(wall time / audio duration). The library functions are used by the benchmarks and system tests.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

SAMPLE_RATE = 24000

# client-side name -> (Triton datatype, numpy dtype); BYTES inputs are UTF-8 strings
_INPUT_TYPES = {
    "text": "BYTES", "task_type": "BYTES", "speaker": "BYTES", "language": "BYTES", "instruct": "BYTES",
    "ref_audio": "FP32", "ref_sample_rate": "INT32", "ref_text": "BYTES", "x_vector_only": "BOOL",
    "voice_id": "BYTES", "sample_format": "BYTES", "stream": "BOOL", "temperature": "FP32",
    "top_k": "INT32", "seed": "INT64", "max_frames": "INT32", "ignore_eos": "BOOL",
}
_NP = {"BYTES": object, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}


class TtsError(RuntimeError):
    """The server answered with an error. ``code`` is the Triton error code name the `tts` model
    put in front of its message (``INVALID_ARG``, ``UNAVAILABLE``, ``CANCELLED``, ``INTERNAL``):
    streaming responses carry only a message, so the model writes the code into it."""

    def __init__(self, message: str):
        super().__init__(message)
        m = re.search(r"\[(INVALID_ARG|UNAVAILABLE|CANCELLED|INTERNAL|NOT_FOUND|UNSUPPORTED|ALREADY_EXISTS|UNKNOWN)\]", message)
        self.code = m.group(1) if m else None


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
    """One gRPC stream (one connection); send requests, collect their responses by request id."""

    def __init__(self, url: str = "127.0.0.1:8001", model: str = "tts"):
        import tritonclient.grpc as grpcclient

        self._g = grpcclient
        self.model = model
        self.client = grpcclient.InferenceServerClient(url)
        self.queues: Dict[str, "queue.Queue"] = {}
        self.client.start_stream(callback=self._callback)

    def _callback(self, result, error):
        if error is not None:
            rid = getattr(error, "request_id", None)
            # tritonclient reports stream errors without the id on some paths: fan out to all
            targets = [rid] if rid in self.queues else list(self.queues)
            for r in targets:
                self.queues[r].put((None, error, time.perf_counter()))
            return
        rid = result.get_response().id
        q = self.queues.get(rid)
        if q is not None:
            q.put((result, None, time.perf_counter()))

    def send(self, inputs: Dict[str, np.ndarray], request_id: Optional[str] = None) -> str:
        return self.send_raw({k: (v, _INPUT_TYPES[k]) for k, v in inputs.items()}, request_id)

    def send_raw(self, inputs: Dict[str, tuple], request_id: Optional[str] = None) -> str:
        """Send ``{name: (array, Triton datatype)}`` as given (no client-side checks)."""
        rid = request_id or uuid.uuid4().hex
        self.queues[rid] = queue.Queue()
        ins = []
        for name, (arr, dtype) in inputs.items():
            t = self._g.InferInput(name, list(arr.shape), dtype)
            t.set_data_from_numpy(arr)
            ins.append(t)
        self.client.async_stream_infer(self.model, ins, request_id=rid, enable_empty_final_response=True)
        return rid

    def receive(self, rid: str, t_send: float, timeout: float = 300.0) -> Synthesis:
        q = self.queues[rid]
        chunks, parts, sr, ttfa = [], [], SAMPLE_RATE, None
        try:
            while True:
                result, error, t = q.get(timeout=timeout)
                if error is not None:
                    raise TtsError(str(error.message() if hasattr(error, "message") else error))
                resp = result.get_response()
                final = resp.parameters["triton_final_response"].bool_param if "triton_final_response" in resp.parameters else False
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
                    total = t - t_send
                    break
        finally:
            del self.queues[rid]
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return Synthesis(audio, sr, ttfa, total, chunks)

    def synthesize(self, timeout: float = 300.0, **kw) -> Synthesis:
        t0 = time.perf_counter()
        rid = self.send(build_inputs(**kw))
        return self.receive(rid, t0, timeout)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def synthesize_http(url: str = "127.0.0.1:8000", model: str = "tts", timeout: float = 300.0, **kw) -> Synthesis:
    """Stream through Triton's HTTP ``generate_stream`` endpoint (server-sent events)."""
    import urllib.request

    body = {}
    for k, arr in build_inputs(**kw).items():
        v = arr.tolist()
        if _INPUT_TYPES[k] == "BYTES":
            v = [x.decode("utf-8") for x in v]
        body[k] = v if k == "ref_audio" else v[0]
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/generate_stream",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    parts, chunks, ttfa, sr = [], [], None, SAMPLE_RATE
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
    total = time.perf_counter() - t0
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return Synthesis(audio, sr, ttfa, total, chunks)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Synthesize speech with the qwen3-tts-triton service.")
    p.add_argument("--text", required=True)
    p.add_argument("--out", default="out.wav", help="output WAV (24 kHz)")
    p.add_argument("--url", default=None, help="server address (default 127.0.0.1:8001 gRPC, :8000 with --http)")
    p.add_argument("--http", action="store_true", help="use HTTP generate_stream instead of gRPC streaming")
    p.add_argument("--task-type", choices=["CustomVoice", "VoiceDesign", "Base"])
    p.add_argument("--speaker")
    p.add_argument("--language")
    p.add_argument("--instruct")
    p.add_argument("--ref-audio", help="reference WAV for Base voice cloning")
    p.add_argument("--ref-text")
    p.add_argument("--x-vector-only", action="store_true")
    p.add_argument("--voice-id")
    p.add_argument("--sample-format", choices=["float32", "int16"])
    p.add_argument("--no-stream", action="store_true", help="one response with the whole utterance")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--max-frames", type=int)
    p.add_argument("--ignore-eos", action="store_true", help="fixed length: always generate max_frames")
    a = p.parse_args(argv)
    kw = dict(text=a.text, task_type=a.task_type, speaker=a.speaker, language=a.language,
              instruct=a.instruct, ref_text=a.ref_text, voice_id=a.voice_id, sample_format=a.sample_format,
              temperature=a.temperature, top_k=a.top_k, seed=a.seed, max_frames=a.max_frames)
    if a.no_stream:
        kw["stream"] = False
    if a.x_vector_only:
        kw["x_vector_only"] = True
    if a.ignore_eos:
        kw["ignore_eos"] = True
    if a.ref_audio:
        import soundfile as sf

        wav, sr = sf.read(a.ref_audio, dtype="float32", always_2d=True)
        kw["ref_audio"], kw["ref_sample_rate"] = wav.mean(axis=1), sr
    try:
        if a.http:
            res = synthesize_http(a.url or "127.0.0.1:8000", **kw)
        else:
            with StreamingClient(a.url or "127.0.0.1:8001") as c:
                res = c.synthesize(**kw)
    except TtsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    import soundfile as sf

    sf.write(a.out, res.audio, res.sample_rate)
    ttfa = f"{res.ttfa * 1000:.1f} ms" if res.ttfa is not None else "n/a"
    print(f"wrote {a.out}: {res.duration:.2f} s of audio in {len(res.chunks)} chunks; "
          f"time to first audio {ttfa}; total {res.total:.2f} s; real-time factor {res.rtf:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
