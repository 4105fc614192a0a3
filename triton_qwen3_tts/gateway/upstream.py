"""The gateway's connection to Triton: the `tts` model over ``tritonclient.grpc.aio`` streaming.

One gRPC stream per request (as ``tools/client.py``): each response and each failure belongs to
one request, and cancelling it (:meth:`TtsStream.cancel`, called when the HTTP client goes away)
cancels that gRPC call, which makes Triton cancel the `tts` request (the model aborts the engine
request and frees its admission slot). The aio channels share one connection.
"""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Dict, Optional

import numpy as np

from triton_qwen3_tts.gateway.errors import ApiError, from_triton_message
from triton_qwen3_tts.serving.tts.request import TTS_INPUTS

__all__ = ["Upstream", "TtsStream", "TTS_INPUT_TYPES"]

# the tts model's inputs -> Triton datatype, from the one list the tts parses them with
TTS_INPUT_TYPES = {name: dtype for name, (dtype, _) in TTS_INPUTS.items()}
_NP = {"BYTES": object, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}


def infer_inputs(values: Dict[str, Any]):
    """tritonclient ``InferInput``s for ``{name: value}`` (see :data:`TTS_INPUT_TYPES`)."""
    import tritonclient.grpc.aio as grpcclient

    out = []
    for name, v in values.items():
        dt = TTS_INPUT_TYPES[name]
        if dt == "BYTES":
            arr = np.array([str(v).encode("utf-8")], dtype=object)
        elif name == "ref_audio":
            arr = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
        else:
            arr = np.array([v], dtype=_NP[dt])
        t = grpcclient.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


class TtsStream:
    """One `tts` request in flight. Iterate for ``(float32 samples, sample_rate)`` per chunk; the
    iteration ends after the FINAL response. A server error raises :class:`ApiError`."""

    def __init__(self, client, model: str, inputs, request_id: str):
        self.request_id = request_id
        self._finished = False

        async def requests():
            # One request, then the client half-closes the stream: Triton finishes the gRPC call
            # (status OK) once the request's final response is written, which ends the iteration.
            # (tritonclient's aio API cannot ask for the empty final response, a reserved parameter.)
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}

        self._it = client.stream_infer(requests())

    def __aiter__(self) -> AsyncIterator:
        return self._chunks()

    async def _chunks(self):
        import grpc

        try:
            while True:
                try:
                    result, error = await self._it.__anext__()
                except StopAsyncIteration:  # the call ended with status OK: the request is finished
                    self._finished = True
                    return
                except grpc.aio.AioRpcError as e:
                    code = e.code()
                    if code == grpc.StatusCode.CANCELLED:
                        raise ApiError(499, "the request was cancelled", None, "CANCELLED") from None
                    raise ApiError(
                        503, f"the server is unavailable: {code.name}: {e.details()}", None, "UNAVAILABLE"
                    ) from None
                if error is not None:
                    self._finished = True
                    raise from_triton_message(error.message() if hasattr(error, "message") else str(error))
                resp = result.get_response()
                audio = result.as_numpy("audio")
                if audio is not None and audio.size:
                    sr = result.as_numpy("sample_rate")
                    rate = int(sr.reshape(-1)[0]) if sr is not None else 24000
                    yield audio.reshape(-1).astype(np.float32, copy=False), rate
                p = resp.parameters.get("triton_final_response")
                if p is not None and p.bool_param:
                    self._finished = True
                    return
        finally:
            self.close()

    def cancel(self) -> None:
        """Cancel the request on the server (no-op once it finished)."""
        if not self._finished:
            self._it.cancel()

    def close(self) -> None:
        if not self._finished:
            self._it.cancel()


class Upstream:
    """The Triton server behind the gateway (gRPC ``url``, model ``model``)."""

    def __init__(self, url: str, model: str = "tts"):
        self.url, self.model = url, model
        self._client = None

    @property
    def client(self):
        if self._client is None:  # created inside the running event loop
            import tritonclient.grpc.aio as grpcclient

            self._client = grpcclient.InferenceServerClient(self.url)
        return self._client

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready(client_timeout=2)) and bool(
                await self.client.is_model_ready(self.model, client_timeout=2)
            )
        except Exception:  # noqa: BLE001 - no answer is "not ready"
            return False

    async def model_parameters(self) -> Dict[str, str]:
        """The `tts` model's config parameters (``checkpoint``, ``default_speaker``...)."""
        cfg = await self.client.get_model_config(self.model, as_json=True, client_timeout=5)
        params = cfg.get("config", cfg).get("parameters", {})
        return {k: v.get("string_value", "") for k, v in params.items()}

    def synthesize(self, values: Dict[str, Any], request_id: Optional[str] = None) -> TtsStream:
        return TtsStream(self.client, self.model, infer_inputs(values), request_id or uuid.uuid4().hex)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
