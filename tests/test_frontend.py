"""The prompt front end's text projection on the CPU and on a GPU (``prompt_device``), and
scripts/prompt_timing.py, which times both on the device machine."""

import importlib.util
from pathlib import Path

import pytest
import torch

from triton_qwen3_tts.model.frontend import PromptFrontend
from triton_qwen3_tts.model.prompt import PromptRequest


def _request(fe):
    return _request_text(fe, "Hello there, how are you?")


def _request_text(fe, text):
    return fe.validate(PromptRequest(task_type=fe.config.task_type, text=text, speaker=fe.config.speakers[0]))


def test_cpu_projection_keeps_no_stream(tiny_checkpoint):
    fe = PromptFrontend(str(tiny_checkpoint), project_device="cpu")
    assert fe.embedder._stream is None
    assert next(fe.embedder.text_projection.parameters()).device.type == "cpu"
    b = fe.build(_request(fe))
    assert b.prompt_embeds.device.type == "cpu" and b.prompt_embeds.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (prompt_device auto projects there)")
def test_gpu_projection_matches_cpu(tiny_checkpoint):
    """The GPU projection's rows come back to the CPU and equal the CPU's within float32 rounding."""
    cpu = PromptFrontend(str(tiny_checkpoint), project_device="cpu")
    gpu = PromptFrontend(str(tiny_checkpoint), project_device="cuda")
    a, b = cpu.build(_request(cpu)), gpu.build(_request(gpu))
    assert b.prompt_embeds.device.type == "cpu" and b.trailing.device.type == "cpu"
    torch.testing.assert_close(b.prompt_embeds, a.prompt_embeds, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.trailing, a.trailing, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu._tts_pad, cpu._tts_pad, rtol=1e-4, atol=1e-5)


def test_gpu_projection_pads_rows_to_a_few_shapes():
    from triton_qwen3_tts.model.frontend import padded_rows

    assert [padded_rows(n) for n in (0, 1, 16, 17, 32, 33, 500, 1024, 1025)] == [
        16,
        16,
        16,
        32,
        32,
        64,
        512,
        1024,
        2048,
    ]
    assert padded_rows(3, least=1) == 4 and padded_rows(1, least=1) == 1


def test_the_gpu_projections_padding_and_warm_up_run_on_the_cpu(tiny_checkpoint, monkeypatch):
    """The GPU path's host logic (rows padded to a power of two, sliced back, shapes kept; the
    load's warm-up of every padded size) with the stream swapped for the CPU: the same rows as
    the plain CPU projection."""
    import contextlib
    from types import SimpleNamespace

    fe = PromptFrontend(str(tiny_checkpoint), project_device="cpu")
    text = "Once upon a time, in a small village at the edge of a great forest, there lived a clockmaker. " * 3
    plain = fe.build(_request_text(fe, text))
    shapes = []
    proj = fe.embedder.text_projection
    proj.register_forward_hook(lambda m, inp, out: shapes.append(tuple(inp[0].shape)))
    synced = []
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    fe.embedder._stream = SimpleNamespace(device=torch.device("cpu"), synchronize=lambda: synced.append(1))
    fe.embedder.WARM_ROWS = 64
    fe.embedder._warm()
    d = proj.linear_fc1.in_features
    assert shapes == [(16, d), (32, d), (64, d)] and synced == [1]
    shapes.clear()
    padded = fe.build(_request_text(fe, text))
    assert all(n in (16, 32, 64, 128) for n, _ in shapes) and max(n for n, _ in shapes) > 16
    torch.testing.assert_close(padded.prompt_embeds, plain.prompt_embeds, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(padded.trailing, plain.trailing, rtol=1e-5, atol=1e-6)
    one = fe.embedder.embed_text(torch.tensor(5))  # a 0-d id keeps its shape
    assert one.shape == (proj.linear_fc2.out_features,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (prompt_device auto projects there)")
def test_gpu_projection_of_a_long_text_matches_cpu(tiny_checkpoint):
    """A text longer than the smallest padded size: the padding rows never reach the prompt."""
    cpu = PromptFrontend(str(tiny_checkpoint), project_device="cpu")
    gpu = PromptFrontend(str(tiny_checkpoint), project_device="cuda")
    text = "Once upon a time, in a small village at the edge of a great forest, there lived a clockmaker. " * 3
    a, b = cpu.build(_request_text(cpu, text)), gpu.build(_request_text(gpu, text))
    assert b.trailing.shape == a.trailing.shape and a.trailing.shape[0] > 16
    torch.testing.assert_close(b.prompt_embeds, a.prompt_embeds, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.trailing, a.trailing, rtol=1e-4, atol=1e-5)


def test_prompt_timing_script_runs(tiny_checkpoint, capsys):
    path = Path(__file__).resolve().parents[1] / "scripts" / "prompt_timing.py"
    spec = importlib.util.spec_from_file_location("prompt_timing", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n = torch.get_num_threads()
    try:
        assert mod.main(["--checkpoint", str(tiny_checkpoint), "--builds", "5", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert "torch threads 1; ms per build over 5 builds" in out
    assert out.count("median") == (2 if torch.cuda.is_available() else 1)


def test_warm_up_projects_on_every_prompt_thread(tiny_checkpoint):
    """TalkerService's warm-up runs a projection on each of its prompt threads (the barrier makes
    the pool start them all), before its requests."""
    import asyncio
    import threading

    from triton_qwen3_tts.serving.talker.service import TalkerService

    fe = PromptFrontend(str(tiny_checkpoint), project_device="cpu")
    threads = set()
    real = fe.embedder.embed_text

    def spy(ids):
        threads.add(threading.current_thread().name)
        return real(ids)

    fe.embedder.embed_text = spy
    svc = TalkerService(fe, engine=None)
    asyncio.run(svc._warm_prompt_threads())
    assert len(threads) == TalkerService.PROMPT_THREADS and all(t.startswith("talker-prompt") for t in threads)
