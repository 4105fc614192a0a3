"""Map package exceptions to Triton error codes (by name, so this stays free of Triton imports)."""

from .admission import Overloaded
from .pipeline import Cancelled
from .request import RequestError


def error_code_name(err: BaseException) -> str:
    """The ``pb_utils.TritonError`` attribute name for ``err``."""
    if isinstance(err, Overloaded):
        return "UNAVAILABLE"
    if isinstance(err, Cancelled):
        return "CANCELLED"
    # RequestError and the prompt builder's PromptError both name the offending input (``.field``).
    if isinstance(err, RequestError) or (isinstance(err, ValueError) and hasattr(err, "field")):
        return "INVALID_ARG"
    return "INTERNAL"
