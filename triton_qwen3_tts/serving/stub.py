"""Process set-up shared by the Triton Python-backend stubs (each ``serving/*/triton.py`` calls
:func:`prepare_process` first thing in ``initialize``, and :func:`freeze_heap` last) and the
engine worker processes."""

import faulthandler
import gc
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


def freeze_heap() -> None:
    """Once a process has loaded (its model, engine, compiled graphs, warm-up): collect, then move
    every object alive into the garbage collector's permanent generation (``gc.freeze``).

    A full collection walks every tracked object. After imports, torch.compile and a model's load
    that is hundreds of thousands of them: about 100 ms on the 2-core development machine
    (218,000 objects after importing the engine and its libraries), taken on whichever thread
    allocates when the collector runs, in the middle of a stream (run 30: one request in nine at
    one stream waited 25-70 ms more for its first audio). Frozen objects are never walked again;
    collections then see only what requests allocate. ``gc.unfreeze`` undoes it (``finalize``)."""
    gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    """Before a model's teardown: frozen objects become collectable again, then collect."""
    gc.unfreeze()
    gc.collect()


def pin_gpu(gpu: int) -> None:
    """Show this stub process only the ``gpu``-th GPU of those the server sees (``gpus`` > 1, split
    pipeline: ``talker_i``). Through ``CUDA_VISIBLE_DEVICES``, so that every library in the process
    (vLLM included, which places itself on device 0) uses that GPU; it must happen before CUDA
    starts in this process. Only for a model whose tensors to and from Triton stay on the host
    (the talker's): Triton numbers a GPU tensor's device as it sees the GPUs, not as this process
    does, so the codecs, which may exchange GPU tensors, use KIND_GPU instances instead
    (:func:`use_instance_gpu`). ``gpu`` -1: nothing to do."""
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


def use_instance_gpu(args) -> None:
    """A KIND_GPU model instance: make its GPU (``model_instance_device_id``, numbered as Triton
    numbers them) this thread's current CUDA device, so that ``cuda`` tensors, streams and CUDA
    graphs of the model land there. The Python backend runs ``initialize`` and ``execute`` of a
    model that is not decoupled on one thread. Other kinds: nothing to do."""
    if args.get("model_instance_kind") != "GPU":
        return
    import torch

    torch.cuda.set_device(int(args["model_instance_device_id"]))
