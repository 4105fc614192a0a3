"""Errors in the OpenAI error shape: ``{"error": {"message", "type", "param", "code"}}``.

``param`` names the request field at fault (as the client sent it, e.g. ``voice`` or
``response_format``); ``code`` is the Triton error code name the server answered with
(``INVALID_ARG``, ``UNAVAILABLE``, ...) or a gateway code (``unsupported_value``,
``voice_exists``, ...). Triton errors arrive as ``[CODE] field: message``
(``serving/errors.py``); :func:`from_triton_message` parses that back.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["ApiError", "from_triton_message", "TTS_FIELD_TO_PARAM"]

_TRITON = re.compile(
    r"^\s*(?:\[request id: [^\]]*\]\s*)?\[(UNKNOWN|INTERNAL|NOT_FOUND|INVALID_ARG|UNAVAILABLE|UNSUPPORTED|"
    r"ALREADY_EXISTS|CANCELLED)\]\s*(?:([A-Za-z_][A-Za-z0-9_.]*): )?(.*)$",
    re.S,
)
# tts input -> the OpenAI request field a client sent it as
TTS_FIELD_TO_PARAM = {
    "text": "input",
    "instruct": "instructions",
    "speaker": "voice",
    "voice_id": "voice",
    "ref_audio": "voice",
    "ref_text": "voice",
    "x_vector_only": "voice",
}
_STATUS = {"INVALID_ARG": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "UNSUPPORTED": 400, "UNAVAILABLE": 503}
_TYPE = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
}


class ApiError(Exception):
    """An HTTP error answer: ``status`` and the OpenAI error body."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        if self.status == 503:
            return "service_unavailable"
        return _TYPE.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", param, code)


def from_triton_message(message: str) -> ApiError:
    """The answer for an error the `tts` model sent (``[CODE] field: message``): its status from
    the code (INVALID_ARG 400, UNAVAILABLE 503, CANCELLED 499, else 500), ``param`` the request
    field the tts input maps to, ``code`` the Triton code."""
    m = _TRITON.match(message or "")
    if not m:
        return ApiError(500, message or "the server failed", None, "INTERNAL")
    code, field, text = m.group(1), m.group(2), m.group(3).strip()
    status = _STATUS.get(code, 499 if code == "CANCELLED" else 500)
    param = TTS_FIELD_TO_PARAM.get(field, field) if field else None
    shown = f"{param}: {text}" if param else text
    if field and param != field:
        shown += f" (tts input {field})"
    return ApiError(status, shown, param, code)
