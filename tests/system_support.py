"""Shared support for the system tests (real tritonserver + the project's client)."""

import os
import re
import socket
import urllib.request

import torch


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_on_free_ports(start, n, attempts=3):
    """``start(ports)`` with ``n`` ports from :func:`free_ports`; returns what it returns.
    The ports are free when chosen, not reserved: another process may bind one (an outgoing
    connection's ephemeral port, another test's server) before the server does, which then fails
    with "already in use". That failure, and only that one, is retried on fresh ports, up to
    ``attempts`` starts in all; any other error, or the last attempt's, is raised as it is."""
    for attempt in range(1, attempts + 1):
        try:
            return start(free_ports(n))
        except Exception as e:
            if "already in use" not in str(e) or attempt == attempts:
                raise


def start_triton(repo, log_path, ready_timeout=300.0):
    """The real tritonserver on ``repo``, on free ports (:func:`start_on_free_ports`), ready and with
    its metrics service up (``launcher.start_server``). Each attempt appends to ``log_path``; a
    failure's message carries the failed start's error lines. Returns the launcher's server; call
    ``.stop()``."""
    from triton_qwen3_tts.tools import launcher

    def start(ports):
        return launcher.start_server(str(repo), *ports, str(log_path), ready_timeout=ready_timeout)

    return start_on_free_ports(start, 3)


def start_tts_server(checkpoint, work, **settings):
    """Build a CPU repository for ``checkpoint`` (Python codec) and start the real server on it.
    ``settings`` override RepositorySettings fields. Returns the server; call ``.stop()``."""
    from triton_qwen3_tts.serving.repository import RepositorySettings, build_repository

    # small limits: the talker context sized from them (max_model_len 0 = from the limits) fits the
    # tiny checkpoint's 4096 positions (vLLM refuses more): 400 frames after 500 + 200 characters
    kw = dict(
        checkpoint=str(checkpoint),
        codec_backend="python",
        device="cpu",
        max_num_seqs=8,
        kv_cache_memory_bytes=64 * 2**20,
        enforce_eager=True,
        max_model_len=0,
        default_max_frames=40,
        max_frames_limit=400,
        max_text_chars=500,
        max_instruct_chars=200,
        codec_queue_delay_us=5000,
        codec_max_batch_size=8,
    )
    kw.update(settings)
    repo = build_repository(RepositorySettings(**kw), str(work / "repo"))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return start_triton(repo, work / "server.log", ready_timeout=600)


def make_reference(checkpoint):
    """Greedy frames of the reference model and their whole-utterance decode, memoised."""
    from triton_qwen3_tts.model.checkpoint import load_checkpoint
    from triton_qwen3_tts.model.generate import generate_codes
    from triton_qwen3_tts.model.prompt import PromptRequest, build_prompt, embed_prompt
    from triton_qwen3_tts.model.sampling import SamplingParams

    ck = load_checkpoint(checkpoint, dtype=torch.float32)
    talker = ck.model.talker
    cache = {}

    def ref(text, speaker="aiden", language="auto", frames=40, **sampling):
        """``sampling``: SamplingParams overrides (e.g. ``repetition_penalty``), still greedy."""
        key = (text, speaker, language, frames, tuple(sorted(sampling.items())))
        if key not in cache:
            layout = build_prompt(
                ck.config,
                ck.tokenizer,
                PromptRequest(task_type="CustomVoice", text=text, speaker=speaker, language=language),
            )
            pe, tr = embed_prompt(layout, talker)
            pad = talker.embed_text([ck.config.tts_pad_token_id])[0]
            codes = generate_codes(
                talker,
                pe,
                tr,
                pad,
                SamplingParams(do_sample=False, subtalker_dosample=False, max_new_tokens=frames + 1, **sampling),
            )
            with torch.no_grad():
                audio = ck.decoder.decode(codes[None])[0].numpy()
            cache[key] = (codes.numpy(), audio)
        return cache[key]

    return ref


def server_state(server):
    """A line for assertion messages: whether the server still runs, and if not its log's end.
    Triton 2.51 (the CPU test server) can die with "Signal (11)" in its gRPC frontend after
    stream cancellations (a race fixed upstream in Triton 25.04,
    https://github.com/triton-inference-server/server/pull/8078); a test that
    fails because the server died must say so, not only "Socket closed"."""
    if server.proc is not None and server.proc.poll() is not None:
        return f"tritonserver DIED (exit {server.proc.returncode}); log tail:\n{server.log_tail(40)}"
    return "tritonserver still running"


def synth(server, **kw):
    from triton_qwen3_tts.tools.client import StreamingClient

    with StreamingClient(server.grpc_url) as c:
        return c.synthesize(timeout=120, **kw)


def wait_idle(server, timeout=60.0):
    """Wait until the tts has no request in flight. A client sees a request's FINAL response just
    before the tts frees its admission slot, so a test that counts slots must wait for this."""
    import time

    deadline = time.time() + timeout
    while metric(server, "qwen3_tts_requests_in_flight") != 0:
        assert time.time() < deadline, f"requests still in flight after {timeout:.0f} s; {server_state(server)}"
        time.sleep(0.2)


def metric(server, name, labels=""):
    """Sum of a metric's samples on the server's metrics port (``labels``: a regex the sample's
    label text must contain, e.g. ``'kind="prefill"'``)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    found = re.finditer(rf"^{name}{{([^}}]*)}} ([0-9.e+-]+)$", text, re.M)
    return sum(float(m.group(2)) for m in found if re.search(labels, m.group(1)))


def batch_sizes(server, model):
    """{batch size: executions} from Triton's statistics for ``model``."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.grpc_url)
    stats = c.get_inference_statistics(model, as_json=True)
    return {
        int(x["batch_size"]): int(x["compute_infer"]["count"])
        for m in stats["model_stats"]
        for x in m.get("batch_stats", [])
    }
