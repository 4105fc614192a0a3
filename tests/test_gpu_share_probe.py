"""scripts/gpu_share_probe.py needs a GPU; here only its argument checks and the clean
exit without CUDA are tested (the H100 figures are in docs/benchmarks.md)."""

import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "gpu_share_probe.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--calls", "1x0"], "shapes like 1x2"),
        (["--calls", "8"], "shapes like 1x2"),
        (["--load-ms", "0"], "--load-ms must be > 0"),
    ],
)
def test_argument_errors(args, msg):
    r = run(*args)
    assert r.returncode == 2 and msg in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the exit without CUDA")
def test_exits_2_without_cuda():
    r = run("--calls", "1x2")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr
