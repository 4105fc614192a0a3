"""One pipeline per GPU without Triton: the router's lane choice and admission
(serving/tts/router.py), the ``gpus`` setting's resolution, the tts service over several lanes, and
the relay of an engine's stream from its own device loop (serving/talker/service.py)."""

import asyncio
import threading

import numpy as np
import pytest
from test_tts_service import FRAMES, FakeCodec, FakeTalker, Sender, b

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.serving.errors import error_code_name
from triton_qwen3_tts.serving.model_config import ModelConfigError, TalkerModelConfig, TtsModelConfig
from triton_qwen3_tts.serving.talker.service import DeviceLoop, relay
from triton_qwen3_tts.serving.tts.router import (
    DeviceError,
    Overloaded,
    Router,
    lane_model_names,
    parse_gpus,
    resolve_devices,
    visible_gpu,
)
from triton_qwen3_tts.serving.tts.service import Metrics, TtsService


def run(coro):
    return asyncio.run(coro)


def test_new_streams_go_to_the_least_loaded_lane_ties_in_turn():
    async def main():
        changes = []
        r = Router(3, per_device=4, max_queued=0, on_change=lambda d, n: changes.append((d, n)))
        got = [await r.acquire() for _ in range(3)]
        assert got == [0, 1, 2] and r.load == [1, 1, 1]
        r.release(1)
        assert await r.acquire() == 1  # the only lane with 0
        r.release(0)
        r.release(2)
        # tie 0/2, the last stream went to lane 1: lane 2 is next in turn, then 0
        assert r.load == [0, 1, 0] and await r.acquire() == 2
        assert await r.acquire() == 0
        assert r.routed == [2, 2, 2] and r.in_flight == 3
        assert changes[:3] == [(0, 1), (1, 1), (2, 1)] and changes[3] == (1, 0)

    run(main())


def test_streams_that_find_the_lanes_level_take_turns():
    # one stream at a time (each done before the next arrives): every lane is always at 0, and
    # lane 0 must not take them all
    async def main():
        r = Router(2, per_device=4, max_queued=0)
        for _ in range(10):
            r.release(await r.acquire())
        assert r.routed == [5, 5]
        # the turn does not make a loaded lane win: the least loaded still does
        d = await r.acquire()
        assert [await r.acquire() for _ in range(3)] == [1 - d, d, 1 - d] and r.load == [2, 2]

    run(main())


def test_per_lane_limit_total_limit_queue_and_refusal():
    async def main():
        r = Router(2, per_device=2, max_queued=1)
        lanes = [await r.acquire() for _ in range(4)]
        assert sorted(lanes) == [0, 0, 1, 1] and r.choose() is None
        waiter = asyncio.ensure_future(r.acquire())
        await asyncio.sleep(0)
        assert r.queued == 1
        with pytest.raises(Overloaded, match=r"limit 2 per GPU on 2 GPU\(s\), 4 in all"):
            await r.acquire()
        assert r.refused == 1
        r.release(1)  # the freed slot goes to the waiter, on the lane that has room
        assert await waiter == 1 and r.load == [2, 2]
        # a total below lanes x per-lane caps the sum
        t = Router(2, per_device=2, max_queued=0, total=3)
        assert [await t.acquire() for _ in range(3)] == [0, 1, 0]
        with pytest.raises(Overloaded):
            await t.acquire()
        t.release(0)
        assert await t.acquire() == 1  # level at [1, 1]; the last stream went to lane 0: lane 1's turn

    run(main())


def test_waiter_goes_to_least_loaded_lane_and_cancelled_waiter_passes_its_slot_on():
    async def main():
        r = Router(2, per_device=1, max_queued=2)
        await r.acquire(), await r.acquire()
        w1 = asyncio.ensure_future(r.acquire())
        w2 = asyncio.ensure_future(r.acquire())
        await asyncio.sleep(0)
        r.release(0)  # handed to w1 ...
        w1.cancel()  # ... which is cancelled before it runs: the slot passes to w2
        with pytest.raises(asyncio.CancelledError):
            await w1
        assert await w2 == 0 and r.load == [1, 1] and r.queued == 0
        w3 = asyncio.ensure_future(r.acquire())
        await asyncio.sleep(0)
        w3.cancel()  # cancelled while queued: leaves without a slot
        with pytest.raises(asyncio.CancelledError):
            await w3
        assert r.queued == 0 and r.load == [1, 1]
        r.release(0), r.release(1)
        assert r.in_flight == 0
        with pytest.raises(ValueError, match="without an acquire"):
            r.release(0)

    run(main())


def test_one_lane_behaves_as_admission():
    async def main():
        r = Router(1, per_device=1, max_queued=1)
        assert await r.acquire() == 0
        w = asyncio.ensure_future(r.acquire())
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):
            await r.acquire()
        r.release(0)
        assert await w == 0 and r.in_flight == 1

    run(main())


@pytest.mark.parametrize(
    "value,device,count,want",
    [
        ("1", "cuda", 1, ["cuda:0"]),
        ("2", "cuda", 4, ["cuda:0", "cuda:1"]),
        ("all", "cuda", 3, ["cuda:0", "cuda:1", "cuda:2"]),
        ("2", "cpu", 0, ["cpu", "cpu"]),
    ],
)
def test_resolve_devices(value, device, count, want):
    assert resolve_devices(value, device, count) == want


@pytest.mark.parametrize(
    "value,device,count,match",
    [
        ("all", "cpu", 0, "'all' counts CUDA GPUs"),
        ("3", "cuda", 2, "3 GPUs asked for, but only 2 visible"),
        ("all", "cuda", 0, "no CUDA GPU is visible"),
        ("0", "cuda", 2, "must be a number of GPUs >= 1 or 'all'"),
        ("x", "cpu", 0, "must be a number"),
        ("+2", "cpu", 0, "must be a number"),
    ],
)
def test_resolve_devices_errors(value, device, count, match):
    with pytest.raises(DeviceError, match=match):
        resolve_devices(value, device, count)


def test_names_and_visible_gpus():
    assert parse_gpus("all") is None and parse_gpus(" 4 ") == 4
    assert lane_model_names("talker", 1) == ["talker"]
    assert lane_model_names("codec_decoder", 2) == ["codec_decoder_0", "codec_decoder_1"]
    assert visible_gpu(1, None) == "1"
    assert visible_gpu(1, "4,6") == "6"
    with pytest.raises(DeviceError, match="shows 2 GPU"):
        visible_gpu(2, "4,6")


def test_model_configs_check_gpus():
    assert TtsModelConfig(checkpoint="/x", gpus="2").gpus == "2"
    assert TtsModelConfig(checkpoint="/x", pipeline="fused", gpus="all").gpus == "all"
    with pytest.raises(ModelConfigError, match="resolved by the repository builder"):
        TtsModelConfig(checkpoint="/x", gpus="all")
    with pytest.raises(ModelConfigError, match="gpus: must be a number"):
        TtsModelConfig(checkpoint="/x", gpus="two")
    assert TalkerModelConfig(checkpoint="/x", device="cuda:1").device == "cuda:1"
    with pytest.raises(ModelConfigError, match="parameter 'gpu'"):
        TalkerModelConfig(checkpoint="/x", device="cpu", gpu=0)


def lanes_service(talkers, codecs, metrics=None, **kw):
    cfg = TtsModelConfig(
        checkpoint="/x", first_chunk_frames=2, chunk_ramp=(4,), chunk_frames=8, left_context_frames=5, gpus="2", **kw
    )
    return TtsService(cfg, Qwen3TTSConfig.from_dict(presets.main_config("tiny")), talkers, codecs, metrics)


def test_service_serves_each_request_on_one_lane_by_load():
    """Three concurrent requests on two lanes of max_in_flight 2: lanes 0, 1, 0; each request's
    frames come from its lane's talker and its chunks go to its lane's codec only; the per-lane
    hooks count them, and every slot is free at the end."""
    per_lane = {"frames": {}, "routed": [], "in_flight": {}}
    m = Metrics(
        device_frames=lambda d, n: per_lane["frames"].__setitem__(d, per_lane["frames"].get(d, 0) + n),
        routed=per_lane["routed"].append,
        device_in_flight=lambda d, n: per_lane["in_flight"].__setitem__(d, n),
    )
    talkers = [FakeTalker(FRAMES, 1, delay=0.002), FakeTalker(FRAMES[:12], 1, delay=0.002)]
    codecs = [FakeCodec(), FakeCodec()]
    svc = lanes_service(talkers, codecs, m, max_in_flight=2, max_queued=0)

    async def main():
        sends = [Sender() for _ in range(3)]
        tasks = []
        for i, s in enumerate(sends):
            tasks.append(asyncio.create_task(svc.handle({"text": b(f"r{i}")}, s)))
            await asyncio.sleep(0.001)  # admitted in order
        await asyncio.gather(*tasks)
        return sends

    sends = run(main())
    assert per_lane["routed"] == [0, 1, 0]
    assert len(talkers[0].started) == 2 and len(talkers[1].started) == 1
    texts = [[inp["text"][0].decode() for _, inp in t.started] for t in talkers]
    assert texts == [["r0", "r2"], ["r1"]]
    for i, s in enumerate(sends):
        assert s.finals == 1 and s.items[-1][0] == "audio"
        n = np.concatenate([x[1] for x in s.items]).size // 1920
        assert n == (12 if i == 1 else 30)
    # lane 1's codec decoded lane 1's 12 frames only (chunk sizes 2, 4, 6 after the schedule)
    assert sum(c[0] - c[1] for c in codecs[1].calls) == 12
    assert sum(c[0] - c[1] for c in codecs[0].calls) == 60
    assert per_lane["frames"] == {0: 60, 1: 12} and per_lane["in_flight"] == {0: 0, 1: 0}
    assert svc.router.in_flight == 0


def test_service_cancel_aborts_on_the_streams_lane_and_refuses_beyond_all_lanes():
    talkers = [FakeTalker(FRAMES, 1, delay=0.01), FakeTalker(FRAMES, 1, delay=0.01)]
    svc = lanes_service(talkers, [FakeCodec(), FakeCodec()], max_in_flight=1, max_queued=0)

    async def main():
        s0, s1, s2 = Sender(), Sender(), Sender()
        flag = {"cancel": False}
        t0 = asyncio.create_task(svc.handle({"text": b("a")}, s0))
        await asyncio.sleep(0.005)
        t1 = asyncio.create_task(svc.handle({"text": b("b")}, s1, lambda: flag["cancel"]))
        await asyncio.sleep(0.005)
        await svc.handle({"text": b("c")}, s2)  # both lanes full, no queue: refused
        flag["cancel"] = True
        await asyncio.gather(t0, t1)
        return s0, s1, s2

    s0, s1, s2 = run(main())
    assert error_code_name(s2.items[0][1]) == "UNAVAILABLE" and s2.finals == 1
    assert error_code_name(s1.items[-1][1]) == "CANCELLED" and s1.finals == 1
    assert talkers[1].aborted == [talkers[1].started[0][0]] and talkers[0].aborted == []
    assert s0.items[-1][0] == "audio" and svc.router.in_flight == 0


def test_lanes_must_pair_up():
    with pytest.raises(ValueError, match="one codec per talker"):
        lanes_service([FakeTalker(FRAMES), FakeTalker(FRAMES)], [FakeCodec()])


def test_relay_from_a_device_loop():
    """An engine's stream on a DeviceLoop (its own thread) read from another loop: items in order,
    its error re-raised, and a consumer that stops early cancels it there (its finally runs on the
    device loop's thread)."""
    dl = DeviceLoop("cpu", name="test")
    where = {}

    async def gen(n, fail=False):
        try:
            for i in range(n):
                await asyncio.sleep(0.001)
                yield i
            if fail:
                raise ValueError("engine refused")
        finally:
            where["thread"] = threading.current_thread().name

    async def main():
        got = [x async for x in relay(dl.loop, lambda: gen(5))]
        assert got == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="engine refused"):
            async for _ in relay(dl.loop, lambda: gen(2, fail=True)):
                pass
        where.clear()
        agen = relay(dl.loop, lambda: gen(10**6))
        async for x in agen:
            if x == 3:
                break
        await agen.aclose()
        for _ in range(200):
            if "thread" in where:
                break
            await asyncio.sleep(0.005)
        assert where["thread"] == "test-loop"  # the cancelled producer cleaned up on its own loop

    try:
        run(main())
    finally:
        dl.close()
    assert not dl.thread.is_alive()


def test_pin_gpu_refuses_a_gpu_it_cannot_show():
    """serving/stub.py pin_gpu in a process of its own (it sets CUDA_VISIBLE_DEVICES): an index
    beyond CUDA_VISIBLE_DEVICES, or a GPU CUDA cannot see (this CPU machine), fails with a message."""
    import os
    import subprocess
    import sys

    code = "from triton_qwen3_tts.serving.stub import pin_gpu; pin_gpu({})"
    for visible, gpu, msg in (("3", 1, "shows 1 GPU"), (None, 0, "no such GPU")):
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        r = subprocess.run([sys.executable, "-c", code.format(gpu)], env=env, capture_output=True, text=True)
        if msg == "no such GPU" and r.returncode == 0:
            pytest.skip("a CUDA GPU is visible here")
        assert r.returncode != 0 and msg in r.stderr, r.stderr[-2000:]
    r = subprocess.run(
        [sys.executable, "-c", code.format(-1) + "; import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "5"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == "5"  # -1: untouched
