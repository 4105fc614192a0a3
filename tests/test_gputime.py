"""GpuTimer's accounting (engines/native/gputime.py) with fake events: pairs are added only once
their end event has completed, oldest first, and never by waiting; the host-clock events of a CPU
device; the increments the tts exports as counters (serving/talker/fused.py)."""

import pytest

from triton_qwen3_tts.engines.native import gputime
from triton_qwen3_tts.engines.native.gputime import GpuTimer, HostEvent, LoopClock
from triton_qwen3_tts.serving.talker.fused import device_time_increments


class FakeClock:
    def __init__(self):
        self.gpu_now = 0.0  # ms the fake GPU has reached


class FakeEvent:
    """Recorded at a fake GPU time; complete once the clock has passed it."""

    clock: FakeClock
    pending_at = 0.0  # where the next record lands on the GPU's timeline

    def record(self):
        self.t = FakeEvent.pending_at

    def query(self):
        return self.clock.gpu_now >= self.t

    def elapsed_time(self, end):
        return end.t - self.t


def make(clock):
    FakeEvent.clock = clock
    return FakeEvent()


def test_disabled_is_a_no_op():
    t = GpuTimer(False, event=lambda: (_ for _ in ()).throw(AssertionError("no event off the GPU")))
    assert t.start() is None
    assert t.stop("step_b1", None) is None
    t.collect()
    assert t.snapshot() == {}


def test_pairs_are_added_once_complete_in_order():
    clock = FakeClock()
    t = GpuTimer(True, event=lambda: make(clock))
    FakeEvent.pending_at = 0.0
    s = t.start()
    FakeEvent.pending_at = 6.5
    end1 = t.stop("step_b64", s)
    s = t.start()
    FakeEvent.pending_at = 9.0
    t.stop("codec_first", s)
    assert end1 is not None and end1.t == 6.5
    t.collect()  # nothing has completed: nothing added, nothing waited for
    assert t.snapshot() == {}
    clock.gpu_now = 7.0  # the step is done, the codec call is not
    t.collect()
    assert t.snapshot() == {"step_b64": {"ms": 6.5, "calls": 1, "mean_ms": 6.5}}
    clock.gpu_now = 9.0
    t.collect()
    snap = t.snapshot()
    assert snap["codec_first"] == {"ms": 2.5, "calls": 1, "mean_ms": 2.5}
    assert snap["step_b64"]["calls"] == 1  # not counted twice


def _launch(t, kind, start_at, end_at):
    FakeEvent.pending_at = start_at
    s = t.start()
    FakeEvent.pending_at = end_at
    t.stop(kind, s)


def test_gaps_between_launches_by_transition():
    clock = FakeClock()
    t = GpuTimer(True, event=lambda: make(clock))
    _launch(t, "step_b64", 0.0, 5.0)
    _launch(t, "codec_done", 5.0, 11.0)  # queued behind the step: no gap
    _launch(t, "step_b32", 11.5, 16.0)  # the GPU waited 0.5 ms for the host
    _launch(t, "step_b64", 16.25, 21.0)
    _launch(t, "prefill", 100.0, 103.0)  # the loop had no work for 79 ms
    clock.gpu_now = 16.0
    t.collect()  # up to the second step: its gap is known, the next pair's is not yet
    assert t.gap_snapshot() == {"codec>step": {"ms": 0.5, "calls": 1}, "step>codec": {"ms": 0.0, "calls": 1}}
    clock.gpu_now = 200.0
    t.collect()
    assert t.gap_snapshot() == {
        "codec>step": {"ms": 0.5, "calls": 1},
        "idle": {"ms": 79.0, "calls": 1},
        "step>codec": {"ms": 0.0, "calls": 1},
        "step>step": {"ms": 0.2, "calls": 1},  # 0.25 rounded to 0.1 ms
    }
    assert [gputime.kind_group(k) for k in ("step_b8", "codec_first", "prefill")] == ["step", "codec", "prefill"]


def test_pending_pairs_are_bounded(monkeypatch):
    monkeypatch.setattr(gputime, "MAX_OPEN", 3)
    clock = FakeClock()
    t = GpuTimer(True, event=lambda: make(clock))
    FakeEvent.pending_at = 1.0
    for _ in range(5):
        t.stop("prefill", t.start())
    assert t.dropped == 2
    clock.gpu_now = 1.0
    t.collect()
    assert t.snapshot()["prefill"]["calls"] == 3
    assert t.gap_snapshot()["prefill>prefill"]["calls"] == 2  # between the three kept


def test_host_event_times_synchronous_work():
    t = GpuTimer(True, event=HostEvent)
    s = t.start()
    sum(range(20000))
    end = t.stop("prefill", s)
    end.synchronize()  # a no-op: the work is done
    t.collect()
    snap = t.snapshot()["prefill"]
    assert snap["calls"] == 1 and snap["ms"] >= 0.0


def test_device_time_increments_count_only_what_grew():
    seen = {}
    first = device_time_increments({"step_b8": {"ms": 12.0, "calls": 2}, "prefill": {"ms": 3.5, "calls": 1}}, seen)
    assert sorted(first) == [("prefill", pytest.approx(0.0035), 1), ("step_b8", pytest.approx(0.012), 2)]
    again = device_time_increments({"step_b8": {"ms": 12.0, "calls": 2}, "prefill": {"ms": 7.0, "calls": 2}}, seen)
    assert again == [("prefill", pytest.approx(0.0035), 1)]  # step_b8 did not grow: nothing to add
    assert device_time_increments({"step_b8": {"ms": 11.0, "calls": 2}}, seen) == []  # never counts down
    assert seen["step_b8"] == (12.0, 2)


def test_loop_clock_laps_partition_time_and_waits_are_timed_apart():
    now = [10.0]
    clock = LoopClock(clock=lambda: now[0])
    clock.lap("ignored")  # the first lap only starts the clock
    now[0] += 0.002
    clock.lap("admit")
    now[0] += 0.001

    class Ev:
        def synchronize(self):
            now[0] += 0.003

    clock.wait("wait_step", Ev())
    clock.lap("read")  # the wait's 3 ms are part of this lap too
    now[0] += 0.0005
    clock.lap("admit")
    snap = clock.snapshot()
    assert snap == {
        "admit": {"ms": 2.5, "calls": 2},
        "read": {"ms": 4.0, "calls": 1},
        "wait_step": {"ms": 3.0, "calls": 1},
    }
