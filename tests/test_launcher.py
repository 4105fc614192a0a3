"""The launcher starts the real tritonserver (nvidia-pytriton wheel) and stops it cleanly."""

import os
import textwrap

import pytest
from system_support import free_ports

from triton_qwen3_tts.tools import launcher

pytestmark = pytest.mark.system


ECHO = textwrap.dedent("""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 2).astype(np.float32))]))
            return out
""")
CONFIG = textwrap.dedent("""
    name: "echo"
    backend: "python"
    max_batch_size: 0
    input [{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }]
    output [{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }]
    instance_group [{ kind: KIND_CPU count: 1 }]
""")


def test_server_starts_serves_and_stops(tmp_path):
    import numpy as np
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo" / "echo"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text(CONFIG)
    (repo / "1" / "model.py").write_text(ECHO)
    http, grpc, metrics = free_ports(3)
    server = launcher.start_server(
        str(tmp_path / "repo"), http, grpc, metrics, str(tmp_path / "server.log"), ready_timeout=120
    )
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.arange(5, dtype=np.float32)
        inp = grpcclient.InferInput("X", [5], "FP32")
        inp.set_data_from_numpy(x)
        y = client.infer("echo", [inp]).as_numpy("Y")
        np.testing.assert_array_equal(y, x * 2)
    finally:
        server.stop()
    assert server.proc.poll() is not None
    # the whole process group is gone (no orphaned stubs)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)


def test_missing_repository_is_a_clear_error(tmp_path):
    with pytest.raises(launcher.LaunchError, match="does not exist"):
        launcher.server_command(str(tmp_path / "nope"))
