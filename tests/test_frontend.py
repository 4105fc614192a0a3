"""The prompt front end's text projection on the CPU and on a GPU (``prompt_device``), and
scripts/prompt_timing.py, which times both on the device machine."""

import importlib.util
from pathlib import Path

import pytest
import torch

from triton_qwen3_tts.model.frontend import PromptFrontend
from triton_qwen3_tts.model.prompt import PromptRequest


def _request(fe):
    return fe.validate(
        PromptRequest(task_type=fe.config.task_type, text="Hello there, how are you?", speaker=fe.config.speakers[0])
    )


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
