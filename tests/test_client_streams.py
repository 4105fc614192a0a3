"""Error attribution and cancellation in the gRPC client (``StreamingClient``), the client CLI's
one-line errors and help, and the service benchmark's timeouts, drain and underrun column, all
without a server: tritonclient's ``InferenceServerClient`` is replaced by a fake that plays the
server on each stream (the real server: test_system_tts.py).

Why one stream per request: the server puts the request id into an error response, but
tritonclient's stream callback receives only ``InferenceServerException(msg=error_message)``
(``test_tritonclient_stream_callback_drops_the_id_of_an_error``), so on a shared stream an error
could belong to any pending request.
"""

import importlib.util
import io
import queue
import threading
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import InferResult, service_pb2  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from triton_qwen3_tts.tools import client as cl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
URL = "127.0.0.1:9"
SPF = 1920


def infer_result(rid, samples, final):
    """A real InferResult as the `tts` model sends it: ``samples`` of audio (none: an empty
    final response) and the sample rate."""
    r = service_pb2.ModelInferResponse(model_name="tts", id=rid)
    if samples:
        for name, dt, arr in (
            ("audio", "FP32", np.full(samples, 0.1, np.float32)),
            ("sample_rate", "INT32", np.array([24000], np.int32)),
        ):
            o = r.outputs.add()
            o.name, o.datatype = name, dt
            o.shape.extend([arr.size])
            r.raw_output_contents.append(arr.tobytes())
    r.parameters["triton_final_response"].bool_param = final
    return InferResult(r)


class FakeStream:
    """Replaces ``tritonclient.grpc.InferenceServerClient``: one gRPC stream as tritonclient
    presents it (a callback that gets ``result`` or ``error``). The test plays the server through
    ``respond``/``fail``/``break_stream``; ``FakeStream.script`` (text -> action) answers on its
    own on a thread: "ok" (2 chunks of 2 frames, then an empty final), "fail" (the server's error
    response: a message, no id, as tritonclient hands it over), "hang" (nothing)."""

    by_rid = {}
    all = []
    script = None
    lock = threading.Lock()

    def __init__(self, url):
        self.url, self.callback, self.rid, self.text = url, None, None, None
        self.stopped = None  # "cancel" | "graceful"
        with FakeStream.lock:
            FakeStream.all.append(self)

    def is_server_live(self, client_timeout=None):
        return True

    def start_stream(self, callback):
        self.callback = callback

    def async_stream_infer(self, model, inputs, request_id="", enable_empty_final_response=False):
        assert enable_empty_final_response
        self.rid = request_id
        for i in inputs:
            if i.name() == "text":
                self.text = i._raw_content[4:].decode()  # serialized BYTES: 4-byte length, then the text
        with FakeStream.lock:
            FakeStream.by_rid[request_id] = self
        if FakeStream.script is not None:
            threading.Thread(target=self._play, daemon=True).start()

    def _play(self):
        action = next((act for key, act in FakeStream.script.items() if key in self.text), "ok")
        time.sleep(0.01)
        if action == "fail":
            self.fail("[INVALID_ARG] speaker: unknown speaker 'bob'")
        elif action == "ok":
            for _ in range(2):
                self.respond(2 * SPF, False)
                time.sleep(0.005)
            self.respond(0, True)

    def respond(self, samples, final):
        if self.stopped is None:
            self.callback(result=infer_result(self.rid, samples, final), error=None)

    def fail(self, msg):
        self.callback(result=None, error=InferenceServerException(msg=msg))

    def break_stream(self, status, details):
        self.callback(result=None, error=InferenceServerException(msg=details, status=status))

    def stop_stream(self, cancel_requests=False):
        if self.stopped is None and self.callback is not None:
            self.stopped = "cancel" if cancel_requests else "graceful"
            if cancel_requests:  # tritonclient reports the cancelled stream through the callback
                self.callback(
                    result=None,
                    error=InferenceServerException(
                        msg="Locally cancelled by application!", status="StatusCode.CANCELLED"
                    ),
                )

    def close(self):
        self.stop_stream()


@pytest.fixture
def fake(monkeypatch):
    FakeStream.by_rid, FakeStream.all, FakeStream.script = {}, [], None
    monkeypatch.setattr(tritonclient_grpc, "InferenceServerClient", FakeStream)
    return FakeStream


def inputs(text="hi"):
    return cl.build_inputs(text=text, max_frames=4)


# --- tritonclient itself -----------------------------------------------------------------------


def test_tritonclient_stream_callback_drops_the_id_of_an_error():
    """What tritonclient's stream thread makes of the server's error response for request "r1":
    the callback gets the message only, nothing that names the request."""
    from tritonclient.grpc._infer_stream import _InferStream

    class Responses:
        def __init__(self, items):
            self.items = iter(items)

        def __iter__(self):
            return self.items

        def cancel(self):
            pass

        def is_active(self):
            return False

    err = service_pb2.ModelStreamInferResponse(error_message="[INVALID_ARG] speaker: unknown speaker 'bob'")
    err.infer_response.id = "r1"  # tritonserver (2.51, the CPU test server) sends the failed request's id
    got = []
    s = _InferStream(lambda result, error: got.append((result, error)), False)
    s._response_iterator = Responses([err])
    s._process_response()
    ((result, error),) = got
    assert result is None and error.message() == err.error_message and error.status() is None
    assert "r1" not in str(error) and not hasattr(error, "request_id")


# --- StreamingClient ---------------------------------------------------------------------------


def test_an_error_response_fails_only_its_own_request(fake):
    c = cl.StreamingClient(URL)
    a, b = c.send(inputs("a")), c.send(inputs("b"))
    assert fake.by_rid[a] is not fake.by_rid[b]  # a stream per request
    fake.by_rid[a].fail("[INVALID_ARG] speaker: unknown speaker 'bob'")  # no id, no status
    fake.by_rid[b].respond(2 * SPF, False)
    fake.by_rid[b].respond(0, True)
    with pytest.raises(cl.TtsError) as e:
        c.receive(a, time.perf_counter(), timeout=5)
    assert e.value.code == "INVALID_ARG" and not isinstance(e.value, cl.TransportError)
    r = c.receive(b, time.perf_counter(), timeout=5)
    assert r.audio.size == 2 * SPF and len(r.chunks) == 1
    # both streams closed gracefully: an error response and a final response end their requests
    assert fake.by_rid[a].stopped == fake.by_rid[b].stopped == "graceful"
    assert c.in_flight == 0 and not c.queues
    c.close()


def test_a_broken_stream_fails_only_its_own_request(fake):
    c = cl.StreamingClient(URL)
    a, b = c.send(inputs("a")), c.send(inputs("b"))
    fake.by_rid[a].break_stream("StatusCode.UNAVAILABLE", "failed to connect to all addresses")
    fake.by_rid[b].respond(2 * SPF, True)
    with pytest.raises(cl.TransportError) as e:
        c.receive(a, time.perf_counter(), timeout=5)
    assert e.value.code == "CONNECTION"
    assert str(e.value) == f"cannot connect to {URL}: failed to connect to all addresses"
    assert c.receive(b, time.perf_counter(), timeout=5).audio.size == 2 * SPF


def test_a_stream_broken_mid_request_is_not_a_connect_failure(fake):
    c = cl.StreamingClient(URL)
    a = c.send(inputs())
    fake.by_rid[a].respond(2 * SPF, False)
    fake.by_rid[a].break_stream("StatusCode.UNAVAILABLE", "Socket closed")
    with pytest.raises(cl.TransportError) as e:
        c.receive(a, time.perf_counter(), timeout=5)
    assert e.value.code == "CONNECTION" and "Socket closed" in str(e.value)
    assert "cannot connect" not in str(e.value)


@pytest.mark.parametrize("cause_first", [True, False])
def test_send_on_a_dead_stream_reports_the_cause(fake, monkeypatch, cause_first):
    """tritonclient's race: when the stream fails before the request is queued (nothing listens),
    async_stream_infer raises "no longer in valid state" and the cause reaches the callback just
    before or just after. receive() reports the cause, whichever came first."""

    def dead(self, model, inputs, request_id="", enable_empty_final_response=False):
        self.rid = request_id
        cause = lambda: self.break_stream("StatusCode.UNAVAILABLE", "failed to connect to all addresses")  # noqa: E731
        if cause_first:
            cause()
        else:
            threading.Timer(0.05, cause).start()
        raise InferenceServerException(
            msg="The stream is no longer in valid state, the error detail is reported through provided callback."
        )

    monkeypatch.setattr(FakeStream, "async_stream_infer", dead)
    c = cl.StreamingClient(URL)
    rid = c.send(inputs())
    with pytest.raises(cl.TransportError) as e:
        c.receive(rid, time.perf_counter(), timeout=5)
    assert str(e.value).startswith(f"cannot connect to {URL}: failed to connect") and "valid state" not in str(e.value)


def test_a_timed_out_request_is_cancelled_alone(fake):
    c = cl.StreamingClient(URL)
    a, b = c.send(inputs("a")), c.send(inputs("b"))
    with pytest.raises(queue.Empty):
        c.receive(a, time.perf_counter(), timeout=0.05)
    assert fake.by_rid[a].stopped == "cancel" and fake.by_rid[b].stopped is None
    assert a not in c.queues and c.in_flight == 1
    fake.by_rid[b].respond(2 * SPF, True)
    assert c.receive(b, time.perf_counter(), timeout=5).audio.size == 2 * SPF


def test_cancel_wakes_the_waiting_receive(fake):
    c = cl.StreamingClient(URL)
    a, b = c.send(inputs("a")), c.send(inputs("b"))
    out = {}

    def wait_a():
        try:
            c.receive(a, time.perf_counter(), timeout=30)
        except cl.TtsError as e:
            out["error"] = e

    t = threading.Thread(target=wait_a)
    t.start()
    time.sleep(0.05)
    c.cancel(a)
    t.join(timeout=5)
    assert not t.is_alive() and out["error"].code == "CANCELLED"
    assert fake.by_rid[a].stopped == "cancel" and fake.by_rid[b].stopped is None
    c.cancel(a)  # a closed request: nothing
    c.close(cancel=True)
    assert fake.by_rid[b].stopped == "cancel"


def test_duplicate_request_id_is_refused(fake):
    c = cl.StreamingClient(URL)
    c.send(inputs(), request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        c.send(inputs(), request_id="x")


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_help_lists_the_allowed_values(capsys):
    from triton_qwen3_tts.model import presets
    from triton_qwen3_tts.serving.tts.request import SAMPLE_FORMATS, TASK_TYPES

    with pytest.raises(SystemExit) as e:
        cl.main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for value in [*presets.SPEAKERS, *presets.LANGUAGES, "auto", *SAMPLE_FORMATS, *TASK_TYPES]:
        assert value in text, value


def test_client_inputs_are_the_tts_inputs():
    """The client sends every tts input with the datatype of the tts model's config."""
    from triton_qwen3_tts.serving.tts.request import TTS_INPUTS

    assert cl._INPUT_TYPES == {name: dtype for name, (dtype, _) in TTS_INPUTS.items()}


def test_cli_sends_the_sampling_flags(monkeypatch, tmp_path):
    sent = {}

    def fake(url, timeout=300.0, **kw):
        sent.update(kw)
        raise cl.TtsError("[INVALID_ARG] stop here")

    monkeypatch.setattr(cl, "synthesize_http", fake)
    args = ["--text", "Hi", "--http", "--out", str(tmp_path / "o.wav"), "--top-p", "0.8"]
    args += ["--repetition-penalty", "1.2", "--subtalker-temperature", "0", "--subtalker-top-k", "9"]
    args += ["--subtalker-top-p", "0.5"]
    assert cl.main(args) == 1
    assert (sent["top_p"], sent["repetition_penalty"], sent["subtalker_temperature"]) == (0.8, 1.2, 0.0)
    assert (sent["subtalker_top_k"], sent["subtalker_top_p"], sent["temperature"]) == (9, 0.5, None)


def test_cli_grpc_server_error_is_one_line(fake, capsys, tmp_path):
    FakeStream.script = {"Hi": "fail"}
    assert cl.main(["--text", "Hi", "--speaker", "bob", "--url", URL, "--out", str(tmp_path / "o.wav")]) == 1
    err = capsys.readouterr().err
    assert err == "error: [INVALID_ARG] speaker: unknown speaker 'bob'\n"


def test_cli_multi_line_message_is_printed_on_one_line(fake, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(FakeStream, "_play", lambda self: self.fail("[INTERNAL] boom\n  at line 2"))
    FakeStream.script = {}
    assert cl.main(["--text", "Hi", "--url", URL, "--out", str(tmp_path / "o.wav")]) == 1
    assert capsys.readouterr().err == "error: [INTERNAL] boom at line 2\n"


@pytest.mark.parametrize(
    "body,expected",
    [
        # a generate_stream whose first response is an error: 400 with the error as an event
        (
            b'data: {"error":"[INVALID_ARG] speaker: unknown speaker \'bob\'"}\n\n',
            "[INVALID_ARG] speaker: unknown speaker 'bob'",
        ),
        (
            b'{"error":"Request for unknown model: \'nope\' is not found"}',
            "Request for unknown model: 'nope' is not found",
        ),
        (b"", "HTTP 502 Bad Gateway"),
    ],
)
def test_http_error_message(body, expected):
    err = urllib.error.HTTPError(
        "http://x", 502 if not body else 400, "Bad Gateway" if not body else "Bad Request", {}, io.BytesIO(body)
    )
    assert cl._http_error_message(err) == expected


def test_http_connection_refused_is_a_transport_error():
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(cl.TransportError) as e:
        cl.synthesize_http(f"127.0.0.1:{port}", text="hi", timeout=5)
    assert e.value.code == "CONNECTION" and str(e.value).startswith(f"cannot connect to 127.0.0.1:{port}: ")


# --- the service benchmark ---------------------------------------------------------------------


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_service", ROOT / "benchmark" / "benchmark_service.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench(tmp_path, fake, script, lines, *args):
    """Run the benchmark on ``lines`` (dataset texts) through StreamingClient over the fake."""
    bs = load_benchmark()
    FakeStream.script = script
    ds = tmp_path / "ds.lst"
    ds.write_text("".join(f"t{i}\t{t}\n" for i, t in enumerate(lines)), encoding="utf-8")
    a = bs.parse_args(["--url", URL, "--dataset", str(ds), "--warmup", "0", "--no-progress", *args])
    out = io.StringIO()
    t0 = time.perf_counter()
    res = bs.run(a, out=out)
    return res, out.getvalue(), time.perf_counter() - t0


def test_benchmark_attributes_each_error_to_its_request(fake, tmp_path):
    """8 requests in flight together on one client, the "fail" ones answered with an error
    response: exactly those fail, with the server's code."""
    lines = ["ok zero", "fail one", "ok two", "fail three"]
    res, _, _ = bench(
        tmp_path, fake, {"fail": "fail"}, lines, "--rate", "1000", "--requests-per-level", "8", "--streams", "1"
    )
    rows = res["requests"]
    assert len(rows) == 8
    for row in rows:
        text = lines[int(row["text_id"][1:])]
        assert row["ok"] == text.startswith("ok"), row
        if not row["ok"]:
            assert row["error_code"] == "INVALID_ARG", row
    assert res["levels"][0]["not_drained"] == 0


def test_benchmark_cancels_a_timed_out_request_on_the_server(fake, tmp_path):
    res, _, _ = bench(
        tmp_path,
        fake,
        {"hang": "hang"},
        ["hang here"],
        "--concurrency",
        "1",
        "--requests-per-level",
        "2",
        "--timeout",
        "0.1",
        "--drain-timeout",
        "5",
    )
    assert [row["error_code"] for row in res["requests"]] == ["TIMEOUT", "TIMEOUT"]
    streams = [s for s in FakeStream.all if s.rid]
    assert len(streams) == 2 and all(s.stopped == "cancel" for s in streams)
    assert res["levels"][0]["not_drained"] == 0  # nothing left in flight: the timeouts cancelled them


@pytest.mark.parametrize("load", [["--concurrency", "3"], ["--rate", "1000"]])
def test_benchmark_level_drains_within_the_bound_or_says_so(fake, tmp_path, load):
    """Requests that never finish (but within --timeout per response): the level waits
    --drain-timeout after its last send, cancels them and says so; the next level starts clean."""
    res, out, took = bench(
        tmp_path,
        fake,
        {"hang": "hang"},
        ["hang here"],
        *load,
        "--requests-per-level",
        "3",
        "--timeout",
        "60",
        "--drain-timeout",
        "0.3",
    )
    lvl = res["levels"][0]
    assert lvl["not_drained"] == 3 and lvl["failure_codes"] == {"CANCELLED": 3}
    assert "did NOT drain: 3 request(s)" in out
    assert took < 10
    assert all(s.stopped == "cancel" for s in FakeStream.all if s.rid)


def test_benchmark_drained_level_and_underrun_percentage(fake, tmp_path):
    res, out, _ = bench(tmp_path, fake, {}, ["ok"], "--concurrency", "2", "--requests-per-level", "4")
    lvl = res["levels"][0]
    assert lvl["ok"] == 4 and lvl["not_drained"] == 0 and "did NOT drain" not in out
    # each request names its closed-loop worker, which sends its next one after the last ended
    by_worker = {}
    for row in res["requests"]:
        by_worker.setdefault(row["worker"], []).append((row["t_send"], row["t_send"] + row["latency"]))
    assert set(by_worker) <= {0, 1} and sum(map(len, by_worker.values())) == 4
    for spans in by_worker.values():
        spans.sort()
        assert all(nxt[0] >= prev[1] for prev, nxt in zip(spans, spans[1:]))
    assert {"underruns_total", "requests_with_underrun"} <= set(lvl)  # the JSON keeps the counts
    assert all(s.stopped == "graceful" for s in FakeStream.all if s.rid)


def test_table_shows_underruns_as_a_percentage_of_requests():
    from triton_qwen3_tts.tools import bench_metrics as bm

    bs = load_benchmark()
    smooth = [(0.1, 24000), (0.5, 24000)]
    gap = [(0.1, 2400), (1.0, 2400)]  # 0.1 s of audio, the next chunk 0.9 s later: an underrun
    recs = [
        bm.RequestRecord(t_send=0.0, ok=True, latency=1.0, ttfa=0.1, chunks=c) for c in (smooth, smooth, smooth, gap)
    ]
    agg = bm.aggregate(recs, level=1)
    assert agg["requests_with_underrun"] == 1
    row = bs.table_row(agg)
    assert row.split()[-1] == "25.0%", row
    none_ok = bm.aggregate([bm.RequestRecord(t_send=0.0, ok=False, error_code="X")], wall=1.0)
    assert bs.table_row(none_ok).split()[-1] == "-"
