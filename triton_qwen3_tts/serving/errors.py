"""Map package exceptions to Triton error codes (by name, so this stays free of Triton imports),
and back: an error a downstream model (talker, codec) sent is parsed into its code, field and text
and re-raised with that code and field, so the client sees it once, as the model wrote it.

Every model of this repository sends its errors as ``[CODE] field: message`` (``CODE`` is the
:func:`error_code_name` of the exception, ``field`` the offending input where there is one). The
`tts` BLS adapter turns a talker or codec error response into an exception with
:func:`downstream_error`; :func:`error_code_name` maps that exception to the same code, and its
``str()`` is ``field: message`` again (``model: message`` when the error names no field), so the
`tts` model's own ``[CODE] ...`` prefix is the only one the client sees.
"""

import re
from typing import Any, Optional, Tuple

from triton_qwen3_tts.serving.faults import Unavailable
from triton_qwen3_tts.serving.tts.pipeline import Cancelled
from triton_qwen3_tts.serving.tts.request import RequestError

# pb_utils.TritonError's code names (attributes of the class; tritonclient prints the same names)
CODE_NAMES = (
    "UNKNOWN",
    "INTERNAL",
    "NOT_FOUND",
    "INVALID_ARG",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "ALREADY_EXISTS",
    "CANCELLED",
)
# "[CODE] " at the start, after an optional "[request id: ...] " that Triton puts before some errors
_CODE_PREFIX = re.compile(r"\s*(?:\[request id: [^\]]*\]\s*)?\[(" + "|".join(CODE_NAMES) + r")\]\s*")
# "field: " where field is an input name (identifier, dotted for config fields such as EngineConfig.x)
_FIELD_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*): ")


class InvalidInput(ValueError):
    """A model's input is invalid (the codec models' refusals); the message names the input."""


def error_code_name(err: BaseException) -> str:
    """The ``pb_utils.TritonError`` attribute name for ``err``."""
    if isinstance(err, DownstreamError):  # a talker/codec error keeps the code that model sent
        return err.code
    if isinstance(err, Unavailable):  # admission refusal, stalled request, dead peer process
        return "UNAVAILABLE"
    if isinstance(err, Cancelled):
        return "CANCELLED"
    # RequestError and the prompt builder's PromptError both name the offending input (``.field``).
    # (an EngineError whose ``field`` is None names no input: INTERNAL)
    if isinstance(err, (RequestError, InvalidInput)) or (isinstance(err, ValueError) and getattr(err, "field", None)):
        return "INVALID_ARG"
    return "INTERNAL"


def triton_error(err: BaseException, error_cls: Any) -> Any:
    """``err`` as a ``pb_utils.TritonError`` (``error_cls``): the code of :func:`error_code_name`,
    the message ``[CODE] err`` (gRPC and HTTP streaming carry only the message, so it starts with
    the code name too). Every Triton layer (``serving/*/triton.py``) answers errors through this."""
    name = error_code_name(err)
    return error_cls(f"[{name}] {err}", getattr(error_cls, name))


def parse_error_message(message: str, default_code: str = "INTERNAL") -> Tuple[str, Optional[str], str]:
    """Split a model's error message ``[CODE] field: text`` into ``(code, field, text)``.

    ``code`` is ``default_code`` when the message has no ``[CODE]`` prefix (an error Triton itself
    raised, or a model that does not write one: then the response's own code is the best guess);
    ``field`` is None when the text does not start with ``name: ``. Only the first prefix is
    taken: an older, doubly wrapped message keeps its inner prefix in ``text``.
    """
    if default_code not in CODE_NAMES:
        raise ValueError(f"default_code must be one of {', '.join(CODE_NAMES)}, got {default_code!r}")
    message = str(message)
    m = _CODE_PREFIX.match(message)
    code, rest = (m.group(1), message[m.end() :]) if m else (default_code, message.strip())
    f = _FIELD_PREFIX.match(rest)
    if f is None:
        return code, None, rest
    return code, f.group(1), rest[f.end() :]


def code_name_of(code: Any, codes: Any = None) -> str:
    """The name of a Triton error code: ``code`` as a name already, or the attribute of ``codes``
    (``pb_utils.TritonError``) whose value it is; INTERNAL when unknown."""
    if isinstance(code, str) and code in CODE_NAMES:
        return code
    if codes is not None:
        for name in CODE_NAMES:
            if getattr(codes, name, object()) == code:
                return name
    return "INTERNAL"


class DownstreamError(Exception):
    """An error a model this one called (talker, codec) answered with, re-raised as it was sent:
    ``code`` (a :data:`CODE_NAMES` entry), ``field`` (the input it names, or None), ``text``
    (the message after the field) and ``model`` (who sent it). ``str()`` is ``field: text``, or
    ``model: text`` when there is no field. Make them with :func:`downstream_error`, which picks
    the subclass that the rest of the package treats like its own errors of that code."""

    def __init__(self, model: str, code: str, field: Optional[str], text: str):
        self.model, self.code, self.field, self.text = model, code, field, text
        Exception.__init__(self, f"{field or model}: {text}")


class DownstreamInvalidArg(DownstreamError, RequestError):
    """INVALID_ARG from a downstream model: a :class:`RequestError` naming the same input."""


class DownstreamUnavailable(DownstreamError, Unavailable):
    """UNAVAILABLE from a downstream model (e.g. every stateful-codec state slot taken)."""


def downstream_error(model: str, error: Any, codes: Any = None) -> DownstreamError:
    """The exception to raise for an error response of ``model``.

    ``error`` is the message (str) or a Triton error object (``.message()`` and ``.code()``);
    ``codes`` maps its numeric code to a name (``pb_utils.TritonError``). The message's own
    ``[CODE]`` prefix wins over the response's code: the BLS response of a decoupled model has
    carried INTERNAL for its INVALID_ARG error. An INVALID_ARG without a field names ``model``."""
    if isinstance(error, str):
        message, fallback = error, "INTERNAL"
    else:
        message = error.message()
        fallback = code_name_of(error.code(), codes) if hasattr(error, "code") else "INTERNAL"
    code, field, text = parse_error_message(message, fallback)
    if code == "INVALID_ARG":
        return DownstreamInvalidArg(model, code, field or model, text)
    if code == "UNAVAILABLE":
        return DownstreamUnavailable(model, code, field, text)
    return DownstreamError(model, code, field, text)


# Legacy guess for an engine error that names no field: the first of these in its message.
_GUESSED_FIELDS = ("max_frames", "top_k", "top_p", "temperature", "seed")


def as_request_error(err: BaseException, default_field: str = "text") -> RequestError:
    """A :class:`RequestError` for a refusal of the prompt builder (``PromptError``) or a talker
    engine (``EngineError``): the field the error names (``.field``), else the first input of
    :data:`_GUESSED_FIELDS` its message mentions, else ``default_field``. The message loses a
    leading ``field: `` it already carries, so the field is written once."""
    field = getattr(err, "field", None)
    text = getattr(err, "message", None)
    if not isinstance(text, str):
        text = str(err)
    if not field:
        field = next((f for f in _GUESSED_FIELDS if f in text), default_field)
    if text.startswith(f"{field}: "):
        text = text[len(field) + 2 :]
    return RequestError(field, text)
