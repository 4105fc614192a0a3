"""Process set-up shared by the Triton Python-backend stubs (each ``serving/*/triton.py`` calls
:func:`prepare_process` first thing in ``initialize``)."""

import faulthandler
import locale


def prepare_process() -> None:
    """UTF-8 text I/O and crash stacks in the server log.

    The Python-backend stub process starts with the C (ASCII) locale, so ``open()`` would read the
    tokenizer files and write logs as ASCII. ``faulthandler`` makes a crash inside the stub (a C
    extension, the backend itself) leave every thread's Python stack in the server log instead of
    only "Stub process is not healthy".
    """
    locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    faulthandler.enable()
