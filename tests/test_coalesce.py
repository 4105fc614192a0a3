import numpy as np
import pytest

from qwen3_tts_triton.serving.coalesce import FrameCoalescer, check_response_frames
from qwen3_tts_triton.streaming import ChunkScheduler, ScheduleConfig


def frames(a, b):
    return np.arange(a, b, dtype=np.int32)[:, None].repeat(16, axis=1)


@pytest.mark.parametrize("arrivals", [[1] * 60, [3, 1, 7, 20, 2, 27], [60], [2, 4, 8, 16, 25, 5]])
def test_responses_follow_the_sizes_and_keep_every_frame_in_order(arrivals):
    c = FrameCoalescer([2, 4, 8, 16, 25])
    got, pos = [], 0
    for n in arrivals:
        got += c.push(frames(pos, pos + n))
        pos += n
    tail = c.flush()
    assert [len(g) for g in got] == [2, 4, 8, 16, 25]  # 55 of 60 frames in full chunks
    assert len(tail) == 5
    np.testing.assert_array_equal(np.concatenate(got + [tail]), frames(0, 60))


def test_a_response_leaves_as_soon_as_its_chunk_is_complete():
    c = FrameCoalescer([2, 3])
    assert c.push(frames(0, 1)) == []
    out = c.push(frames(1, 2))
    assert [len(o) for o in out] == [2]
    assert c.push(frames(2, 4)) == []
    assert [len(o) for o in c.push(frames(4, 9))] == [3, 3]  # last size repeats
    assert len(c.flush()) == 1 and c.flush() is None


def test_sizes_match_the_tts_chunk_schedule():
    """With the tts's own schedule as sizes, every talker response completes exactly one chunk."""
    cfg = ScheduleConfig()
    sizes = [cfg.chunk_size(i) for i in range(len(cfg.ramp) + 2)]
    c, sched = FrameCoalescer(sizes), ChunkScheduler(cfg)
    pos = 0
    for _ in range(137):
        for resp in c.push(frames(pos, pos + 1)):
            assert len(sched.push(len(resp))) == 1
        pos += 1
    tail = c.flush()
    sched.push(len(tail))
    assert sched.pending_frames == len(tail) and len(sched.flush()) == 1


def test_no_sizes_passes_through():
    c = FrameCoalescer(None)
    f = frames(0, 3)
    assert c.push(f)[0] is f and c.push(frames(0, 0)) == [] and c.flush() is None


def test_check_response_frames():
    assert check_response_frames(None) is None
    assert check_response_frames(np.zeros(0, np.int32)) is None
    assert check_response_frames(np.array([2, 4, 25], np.int32)) == [2, 4, 25]
    for bad in (np.array([0], np.int32), np.array([5000], np.int32), np.ones(65, np.int32),
                np.array([1.5], np.float32)):
        with pytest.raises(ValueError):
            check_response_frames(bad)
