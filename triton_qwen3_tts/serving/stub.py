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


def pin_gpu(gpu: int) -> None:
    """Show this stub process only the ``gpu``-th GPU of those the server sees (``gpus`` > 1, split
    pipeline: ``talker_i`` and the codec model of GPU i). Through ``CUDA_VISIBLE_DEVICES``, so that
    every library in the process (vLLM included, which places itself on device 0) uses that GPU; it
    must happen before CUDA starts in this process. ``gpu`` -1: nothing to do."""
    import os

    if gpu < 0:
        return
    import torch

    from triton_qwen3_tts.serving.tts.router import visible_gpu

    if torch.cuda.is_initialized():
        raise RuntimeError(f"gpu {gpu}: CUDA already started in this process; cannot pin it to one GPU")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpu(gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if torch.cuda.device_count() < 1:
        raise RuntimeError(
            f"gpu {gpu}: no such GPU (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} shows none)"
        )
