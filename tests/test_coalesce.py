"""Frame coalescing between `talker` and `tts` (coalesce.py, TalkerService.stream): pure, no Triton."""

import asyncio

import numpy as np
import pytest

from triton_qwen3_tts.serving.talker.coalesce import FrameCoalescer, check_response_frames
from triton_qwen3_tts.serving.tts.request import RequestError
from triton_qwen3_tts.serving.talker.service import TalkerService
from triton_qwen3_tts.serving.tts.chunks import ChunkScheduler, ScheduleConfig

SIZES = [2, 4, 8, 16, 25]


def frames(a, b):
    return np.arange(a, b, dtype=np.int32)[:, None].repeat(16, axis=1)


def boundaries(sizes, total):
    """Chunk end positions of ``sizes`` (last repeating) up to ``total``."""
    out, pos, i = [], 0, 0
    while pos + sizes[min(i, len(sizes) - 1)] <= total:
        pos += sizes[min(i, len(sizes) - 1)]
        out.append(pos)
        i += 1
    return out


def run(c, arrivals):
    got, pos = [], 0
    for n in arrivals:
        out = c.push(frames(pos, pos + n))
        pos += n
        if out is not None:
            got.append(out)
    return got, c.flush(), pos


@pytest.mark.parametrize(
    "arrivals", [[1] * 60, [3, 1, 7, 20, 2, 27], [60], [2, 4, 8, 16, 25, 5], [5, 0, 1, 54], [1] * 137]
)
def test_responses_end_on_chunk_boundaries_and_keep_every_frame_in_order(arrivals):
    got, tail, total = run(FrameCoalescer(SIZES), arrivals)
    ends = np.cumsum([len(g) for g in got]).tolist()
    bounds = boundaries(SIZES, total)
    assert set(ends) <= set(bounds)  # every response ends on a chunk boundary ...
    assert not ends or ends[-1] == bounds[-1]  # ... the last complete chunk is never held back
    assert len(got) <= len(bounds)  # at most one response per chunk
    n_tail = total - (bounds[-1] if bounds else 0)
    assert (tail is None) == (n_tail == 0) and (tail is None or len(tail) == n_tail)
    np.testing.assert_array_equal(np.concatenate(got + ([] if tail is None else [tail])), frames(0, total))


def test_one_frame_at_a_time_gives_exactly_one_response_per_chunk():
    got, tail, _ = run(FrameCoalescer(SIZES), [1] * 137)
    assert [len(g) for g in got] == [2, 4, 8, 16, 25, 25, 25, 25] and len(tail) == 7


def test_a_response_leaves_as_soon_as_its_chunk_is_complete():
    c = FrameCoalescer([2, 3])
    assert c.push(frames(0, 1)) is None
    assert len(c.push(frames(1, 2))) == 2
    assert c.push(frames(2, 4)) is None
    assert len(c.push(frames(4, 9))) == 6  # two chunks (last size repeats) complete at once: one response
    assert len(c.flush()) == 1 and c.flush() is None


@pytest.mark.parametrize("arrivals", [[1] * 137, [3, 1, 7, 20, 2, 27, 77], [137]])
def test_sizes_match_the_tts_chunk_schedule(arrivals):
    """With the tts's own schedule as sizes, every talker response completes whole chunks."""
    from triton_qwen3_tts.serving.tts.service import schedule_sizes

    cfg = ScheduleConfig()
    c, sched = FrameCoalescer(schedule_sizes(cfg)), ChunkScheduler(cfg)
    got, tail, _ = run(c, arrivals)
    for resp in got:
        assert len(sched.push(len(resp))) >= 1 and sched.pending_frames == 0
    sched.push(len(tail))
    assert sched.pending_frames == len(tail) and len(sched.flush()) == 1


def test_no_sizes_passes_through():
    c = FrameCoalescer(None)
    f = frames(0, 3)
    assert c.push(f) is f and c.push(frames(0, 0)) is None and c.flush() is None


def test_check_response_frames():
    assert check_response_frames(None) is None
    assert check_response_frames(np.zeros(0, np.int32)) is None
    assert check_response_frames(np.array([2, 4, 25], np.int32)) == [2, 4, 25]
    for bad in (
        np.array([0], np.int32),
        np.array([5000], np.int32),
        np.ones(65, np.int32),
        np.array([1.5], np.float32),
        np.array([-2], np.int32),
    ):
        with pytest.raises(ValueError):
            check_response_frames(bad)


class FakeEngine:
    """Yields one frame per step (as the native engine does when its consumer keeps up)."""

    def __init__(self, n):
        self.n, self.started, self.aborted = n, [], []

    async def synthesize(self, req):
        self.started.append(req)
        for i in range(self.n):
            await asyncio.sleep(0)
            yield frames(i, i + 1)

    async def abort(self, rid):
        self.aborted.append(rid)


def service(n):
    svc = TalkerService(frontend=None, engine=FakeEngine(n))
    svc.parse = lambda rid, inputs: rid  # prompt building is not under test here
    return svc


async def collect(svc, inputs, stop_after=None):
    out = []
    agen = svc.stream("r1", inputs)
    async for f in agen:
        out.append(f)
        if stop_after is not None and len(out) == stop_after:
            break
    await agen.aclose()
    return out


def test_service_sends_one_response_per_chunk_and_counts_them():
    svc = service(40)
    out = asyncio.run(collect(svc, {"response_frames": np.array(SIZES, np.int32)}))
    assert [len(o) for o in out] == [2, 4, 8, 16, 10]
    np.testing.assert_array_equal(np.concatenate(out), frames(0, 40))
    assert svc.stats.responses == 5 and svc.stats.finished == 1 and svc.stats.aborted == 0
    assert svc.engine.aborted == [] and svc.live == {}


def test_service_without_response_frames_is_per_engine_yield():
    svc = service(7)
    out = asyncio.run(collect(svc, {}))
    assert [len(o) for o in out] == [1] * 7 and svc.stats.responses == 7


def test_service_consumer_stopping_early_aborts_the_engine_request():
    svc = service(40)
    out = asyncio.run(collect(svc, {"response_frames": np.array(SIZES, np.int32)}, stop_after=2))
    assert [len(o) for o in out] == [2, 4]
    assert svc.engine.aborted == ["r1"] and svc.stats.aborted == 1 and svc.live == {}


def test_service_bad_response_frames_is_invalid_arg_and_starts_nothing():
    svc = service(5)
    with pytest.raises(RequestError) as e:
        asyncio.run(collect(svc, {"response_frames": np.array([0], np.int32)}))
    assert e.value.field == "response_frames"
    assert svc.engine.started == [] and svc.stats.started == 0 and svc.live == {}


def test_tts_asks_for_its_schedule_and_decodes_coalesced_responses_like_single_frames():
    """End to end without Triton: TtsService -> a talker that coalesces like the real one."""
    import test_tts_service as t

    class CoalescingTalker(t.FakeTalker):
        async def stream(self, rid, inputs):
            self.started.append((rid, inputs))
            c = FrameCoalescer(check_response_frames(inputs.get("response_frames")))
            for i in range(len(self.frames)):
                out = c.push(self.frames[i : i + 1])
                if out is not None:
                    yield out
            if (tail := c.flush()) is not None:
                yield tail

    results = []
    for talker in (t.FakeTalker(t.FRAMES, 1), CoalescingTalker(t.FRAMES)):
        codec, send = t.FakeCodec(), t.Sender()
        asyncio.run(t.service(talker, codec).handle({"text": t.b("hello")}, send))
        assert send.finals == 1
        results.append((codec.calls, [x[1] for x in send.items]))
    # test_tts_service's schedule: 2, 4, then 8 frames (the last repeats)
    assert talker.started[0][1]["response_frames"].tolist() == [2, 4, 8]
    assert results[0][0] == results[1][0]  # the same codec windows
    for a, b_ in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b_)


def test_prompt_building_leaves_the_event_loop_free():
    """A prompt takes milliseconds of CPU to build (tokenizing, projecting its text rows): built
    on the event loop, it would stall the engine's scheduler, which turns on the same loop, for
    every stream. Here each build blocks its thread until the loop has run a coroutine (on the
    loop itself that could never happen: the wait would time out and fail the request) and until
    the other request's build is running too (the two overlap)."""
    import threading

    svc = service(3)
    loop_ran = threading.Event()
    both = threading.Barrier(2, timeout=5)

    def blocking_parse(rid, inputs):
        assert loop_ran.wait(5), "the event loop did not run while a prompt was being built"
        both.wait()
        return rid

    svc.parse = blocking_parse

    async def main():
        async def mark():
            await asyncio.sleep(0)
            loop_ran.set()

        return (await asyncio.gather(collect(svc, {}), collect(svc, {}), mark()))[:2]

    assert [len(o) for o in asyncio.run(main())] == [3, 3]
