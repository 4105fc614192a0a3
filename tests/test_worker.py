"""The tts's client of an engine worker process (serving/talker/worker.py ``ProcessTalker``),
against stand-in workers that speak the pipe protocol (tests/worker_fakes.py), and the
configuration switch that picks worker processes. The real worker (an engine in the process)
runs in tests/test_system_gpus.py through tritonserver.

Each test spawns real processes: the stand-ins are quick to start (no torch)."""

import asyncio
import time

import numpy as np
import pytest
import worker_fakes

from triton_qwen3_tts.serving.errors import error_code_name
from triton_qwen3_tts.serving.faults import PeerDied
from triton_qwen3_tts.serving.model_config import ModelConfigError, TtsModelConfig
from triton_qwen3_tts.serving.talker.worker import ProcessTalker, WorkerWatch, cuda_index, start_workers
from triton_qwen3_tts.serving.tts.request import RequestError


class Cfg:
    device = "cpu"


def text(t):
    return {"text": np.array([t.encode()], dtype=object)}


@pytest.fixture
def worker():
    w = ProcessTalker(Cfg(), "gpu 0 engine", target=worker_fakes.scripted_worker).start()
    w.wait_ready(30)
    yield w
    w.close(timeout=5)


async def collect(w, rid, t):
    return [x async for x in w.stream(rid, text(t))]


def wait_until(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


def test_items_arrive_in_order_and_the_stream_ends(worker):
    got = asyncio.run(collect(worker, "r1", "ok 3"))
    assert [x.tolist() for x in got] == [[0, 0], [1, 1], [2, 2]]
    assert worker.info == {"device": "cpu", "load_s": 0.0}


def test_concurrent_streams_keep_their_own_items(worker):
    async def main():
        return await asyncio.gather(*(collect(worker, f"r{n}", f"ok {n}") for n in range(1, 6)))

    for n, got in enumerate(asyncio.run(main()), start=1):
        assert [x.tolist() for x in got] == [[i, i] for i in range(n)]


def test_a_worker_error_keeps_its_code_and_field(worker):
    with pytest.raises(RequestError) as e:
        asyncio.run(collect(worker, "bad1", "bad"))
    assert error_code_name(e.value) == "INVALID_ARG"
    assert e.value.field == "max_frames"
    assert str(e.value) == "max_frames: must be <= 10, got 99"


def test_a_consumer_that_stops_early_cancels_the_worker_stream(worker):
    async def main():
        agen = worker.stream("h1", text("hang"))
        task = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await agen.aclose()

    asyncio.run(main())
    wait_until(lambda: worker.snapshot()["counts"].get("cancel") == 1)


def test_abort_waits_for_the_worker_and_ends_the_stream_as_cancelled(worker):
    async def main():
        consumer = asyncio.ensure_future(collect(worker, "h2", "hang"))
        await asyncio.sleep(0.2)
        await asyncio.wait_for(worker.abort("h2"), 5)
        with pytest.raises(Exception) as e:
            await consumer
        return e.value

    err = asyncio.run(main())
    assert error_code_name(err) == "CANCELLED"
    wait_until(lambda: worker.snapshot()["counts"].get("abort") == 1)


def test_the_worker_names_itself_for_the_launcher(worker):
    """The launcher finds the tts's engine workers by name among its stubs' children."""
    import os

    from triton_qwen3_tts.serving.stub_procs import Stub, find_workers

    me = Stub(os.getpid(), "tts", "tts_0_0", os.getppid())  # this test process plays the stub
    assert find_workers([me]) == [Stub(worker.process.pid, "tts", "tts_0_0 gpu 0 engine", os.getpid())]


def test_abort_of_a_request_never_streamed_returns(worker):
    """An abort before this client's first stream (the answer must find its way back)."""
    asyncio.run(asyncio.wait_for(worker.abort("never"), 5))
    wait_until(lambda: worker.snapshot()["counts"].get("abort") == 1)


def test_snapshots_carry_the_worker_counts(worker):
    asyncio.run(collect(worker, "s1", "ok 1"))
    wait_until(lambda: worker.snapshot()["counts"].get("streams") == 1)
    assert worker.snapshot()["stats"] == {"name": "gpu 0 engine"}


def test_a_dead_worker_ends_its_streams_unavailable_and_is_reported_once(worker):
    watch = WorkerWatch([worker])
    assert watch.poll() == []

    async def main():
        consumer = asyncio.ensure_future(collect(worker, "live", "hang"))
        await asyncio.sleep(0.2)
        with pytest.raises(PeerDied):
            await asyncio.wait_for(collect(worker, "d1", "die"), 10)
        with pytest.raises(PeerDied):  # the one in flight ends too, not waits for ever
            await asyncio.wait_for(consumer, 10)
        with pytest.raises(PeerDied):  # and a new one is refused at once
            await asyncio.wait_for(collect(worker, "d2", "ok 1"), 5)
        await asyncio.wait_for(worker.abort("d2"), 5)  # nothing to wait for

    asyncio.run(main())
    assert error_code_name(PeerDied("x")) == "UNAVAILABLE"
    dead = watch.poll()
    assert [(s.model, s.instance, s.pid) for s in dead] == [("tts", "gpu 0 engine", worker.process.pid)]
    assert "died" in worker.dead
    assert watch.poll() == []


def test_a_closed_worker_is_not_reported_dead(worker):
    watch = WorkerWatch([worker])
    worker.close(timeout=5)
    assert not worker.process.is_alive()
    wait_until(lambda: worker.dead is not None)
    assert "stopped" in worker.dead
    assert watch.poll() == []


def test_a_failed_start_fails_with_the_worker_message():
    w = ProcessTalker(Cfg(), "gpu 1 engine", target=worker_fakes.failing_worker).start()
    with pytest.raises(RuntimeError, match="gpu 1 engine: RuntimeError: no such checkpoint"):
        w.wait_ready(30)
    w.close(timeout=5)


def test_a_worker_that_crashes_at_start_fails_the_start():
    w = ProcessTalker(Cfg(), "gpu 0 engine", target=worker_fakes.crashing_worker).start()
    with pytest.raises(RuntimeError, match="died before its engine was ready"):
        w.wait_ready(30)
    w.close(timeout=5)


def test_start_workers_stops_every_worker_when_one_fails(monkeypatch):
    import triton_qwen3_tts.serving.talker.worker as worker_mod

    targets = iter([worker_fakes.scripted_worker, worker_fakes.failing_worker])
    made = []

    class Recording(ProcessTalker):
        def __init__(self, cfg, name, gpu=0):
            super().__init__(cfg, name, gpu, target=next(targets))
            made.append(self)

    monkeypatch.setattr(worker_mod, "ProcessTalker", Recording)
    with pytest.raises(RuntimeError, match="no such checkpoint"):
        start_workers([Cfg(), Cfg()], ["gpu 0 engine", "gpu 1 engine"])
    assert len(made) == 2 and not any(w.process.is_alive() for w in made)


@pytest.mark.parametrize(
    "value, lanes, device, expected",
    [
        ("auto", 1, "cpu", False),
        ("auto", 2, "cpu", True),
        ("auto", 1, "cuda", True),
        ("auto", 1, "cuda:0", True),
        ("process", 1, "cpu", True),
        ("thread", 2, "cuda:0", False),
    ],
)
def test_fused_workers_setting_picks_processes(value, lanes, device, expected):
    assert TtsModelConfig(checkpoint="x", fused_workers=value).worker_processes(lanes, device) is expected


def test_fused_workers_setting_refuses_other_values():
    with pytest.raises(ModelConfigError, match="fused_workers"):
        TtsModelConfig(checkpoint="x", fused_workers="fork")


@pytest.mark.parametrize("device, expected", [("cuda", 0), ("cuda:1", 1), ("cuda:0", 0), ("cpu", None)])
def test_the_worker_sets_its_cuda_device_by_index(device, expected):
    # torch.cuda.set_device refuses torch.device("cuda") (no index): one GPU's worker is "cuda"
    assert cuda_index(device) == expected


def test_a_stalled_worker_does_not_block_the_tts_event_loop(worker):
    # the worker stops reading for 3 s; meanwhile streams with 1 MB of reference audio each (more
    # than a pipe holds) are sent: the loop that sends them keeps running, and every stream is
    # served once the worker reads again
    big = np.zeros(256 * 1024, np.float32)

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        deaf = asyncio.create_task(collect(worker, "deaf", "deaf 3"))
        await asyncio.sleep(0.3)  # the worker is asleep now
        t0 = time.perf_counter()
        big_ones = [
            asyncio.create_task(collect_inputs(worker, f"big{i}", {**text("big 1"), "ref_audio": big}))
            for i in range(4)
        ]
        await asyncio.sleep(1.0)
        ticks_while_stalled = ticks
        stalled_for = time.perf_counter() - t0
        got = await asyncio.wait_for(asyncio.gather(deaf, *big_ones), 30)
        stop.set()
        await t
        return ticks_while_stalled, stalled_for, got

    ticks, stalled_for, got = asyncio.run(main())
    # blocked in a send, the loop would not have ticked at all until the worker woke (at 3 s)
    assert stalled_for < 2.5 and ticks >= 20, (ticks, stalled_for)
    assert [len(g) for g in got] == [1, 1, 1, 1, 1]


async def collect_inputs(w, rid, inputs):
    return [x async for x in w.stream(rid, inputs)]


def test_pipe_sender_never_blocks_and_keeps_the_order():
    """Both sides send through PipeSender: with nobody reading, queuing a megabyte of audio (a
    blocking send stops after the pipe's 64 KiB) returns at once; once the other side reads,
    every message arrives, in order, and close() has flushed them."""
    import multiprocessing

    from triton_qwen3_tts.serving.talker.worker import PipeSender

    a, b = multiprocessing.Pipe()
    sender = PipeSender(a, "t")
    chunk = np.zeros(48000, np.float32)  # a 25-frame chunk: 192 KB
    t0 = time.perf_counter()
    for i in range(6):
        sender.send(("item", f"r{i}", chunk))
    assert time.perf_counter() - t0 < 0.5
    got = [b.recv() for _ in range(6)]
    assert [m[1] for m in got] == [f"r{i}" for i in range(6)] and got[0][2].shape == (48000,)
    sender.send(("end", "r0", None))
    sender.close()
    assert b.recv() == ("end", "r0", None)
    a.close()
    b.close()


def test_engine_threads_share_the_cpus_between_gpu_workers():
    from triton_qwen3_tts.serving.talker.worker import engine_threads

    assert engine_threads(0, cpus=16, gpus=1) == 4  # at most 4
    assert engine_threads(0, cpus=6, gpus=2) == 3
    assert engine_threads(0, cpus=2, gpus=4) == 1  # at least 1
    assert engine_threads(0, cpus=8, gpus=0) == 4
    assert engine_threads(12, cpus=2, gpus=4) == 12  # the setting, as given


def test_freeze_heap_moves_the_loaded_objects_out_of_collections():
    """stub.freeze_heap (end of every model's and worker's load): what is alive then is never
    collected, even once it is garbage; thaw_heap (teardown) makes it collectable again."""
    import gc
    import weakref

    from triton_qwen3_tts.serving.stub import freeze_heap, thaw_heap

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a reference cycle: only the collector frees it
    alive = weakref.ref(a)
    try:
        freeze_heap()
        del a, b
        gc.collect()
        assert alive() is not None  # frozen: the collection did not walk it
    finally:
        thaw_heap()
    assert alive() is None and gc.get_freeze_count() == 0
