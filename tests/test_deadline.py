"""The fused pipeline's scheduling choice (serving/talker/deadline.py), pure, with a fake clock:
first chunks go first, then streams by buffer slack; a full buffer waits and its chunk grows; a
talker step comes between non-critical decodes; an idle talker flushes everything; batches
group equal frame counts rounded to the codec's frame buckets."""

import pytest

from triton_qwen3_tts.serving.talker.deadline import FRAME_SECONDS, DeadlinePolicy, StreamState


def policy(**kw):
    base = dict(
        first_chunk_frames=1,
        ramp=(4, 8),
        chunk_frames=16,
        buffer_s=0.4,
        urgent_s=0.1,
        max_batch=8,
        frame_buckets=(1, 2, 4, 8, 16),
    )
    base.update(kw)
    return DeadlinePolicy(**base)


def playing(sid, now, slack, pending, chunks=3, t_submit=0.0):
    """A stream that has sent ``chunks`` chunks and holds ``slack`` seconds of audio at ``now``."""
    delivered = 10
    return StreamState(
        sid,
        t_submit,
        pending=pending,
        delivered=delivered,
        chunks=chunks,
        t_first=now + slack - delivered * FRAME_SECONDS,
    )


def test_slack_is_audio_delivered_minus_time_played():
    s = StreamState(1, 0.0, delivered=5, chunks=1, t_first=10.0)
    assert s.slack(10.1) == pytest.approx(0.3)
    assert StreamState(2, 0.0).slack(1.0) is None


def test_first_chunks_go_first_in_arrival_order():
    p, now = policy(), 5.0
    streams = [
        playing(1, now, slack=0.05, pending=16),  # critical, but a first chunk still goes first
        StreamState(2, t_submit=4.9, pending=1),
        StreamState(3, t_submit=4.8, pending=2),
        StreamState(4, t_submit=4.7, pending=0),  # no frame yet: nothing to decode
    ]
    b = p.pick(streams, now, talker_busy=True)
    assert b.reason == "first" and b.frames == 1 and b.sids == (3, 2)
    streams[1].chunks = streams[2].chunks = 1
    streams[1].pending = streams[2].pending = 0
    b = p.pick(streams, now, talker_busy=True)
    assert b.reason == "critical" and b.sids == (1,) and b.frames == 16


def test_full_buffer_waits_and_its_chunk_grows():
    p, now = policy(), 1.0
    s = playing(1, now, slack=1.0, pending=5)
    assert p.pick([s], now, talker_busy=True) is None  # buffer full: a talker step
    s.pending = 13
    later = now + 0.7  # slack 0.3 < buffer_s: due once its chunk (16 after the ramp) is pending
    assert p.pick([s], later, talker_busy=True) is None
    s.pending = 20
    b = p.pick([s], later, talker_busy=True)
    assert b.reason == "due" and b.frames == 16  # at most chunk_frames; 4 stay pending


def test_due_and_critical_wait_for_their_ramp_size():
    p, now = policy(), 2.0
    s = playing(1, now, slack=0.3, pending=2, chunks=1)  # next chunk size: ramp[0] = 4
    assert p.pick([s], now, talker_busy=True) is None
    s.pending = 4
    assert p.pick([s], now, talker_busy=True).frames == 4
    c = playing(2, now, slack=0.05, pending=5, chunks=1)
    b = policy().pick([c], now, talker_busy=True)
    assert b.reason == "critical" and b.frames == 4  # 5 -> bucket 4


def test_talker_step_between_two_non_critical_decodes():
    p, now = policy(), 3.0
    a = playing(1, now, slack=0.3, pending=16)
    b = playing(2, now, slack=0.35, pending=8)  # due at 16 frames (its ramp is over)
    first = p.pick([a, b], now, talker_busy=True)
    assert first.sids == (1,) and first.frames == 16
    b.pending = 16
    a.pending = 0
    assert p.pick([a, b], now, talker_busy=True) is None  # the talker's turn
    assert p.pick([a, b], now, talker_busy=True).sids == (2,)
    # critical streams do not wait for the talker
    c = playing(3, now, slack=0.01, pending=32)
    assert p.pick([c], now, talker_busy=True).reason == "critical"
    assert p.pick([c], now, talker_busy=True).reason == "critical"


def test_critical_decodes_alternate_with_steps_while_a_stream_waits_for_its_first_frames():
    p, now = policy(), 3.0
    c = playing(3, now, slack=0.01, pending=32)
    assert p.pick([c], now, talker_busy=True, talker_urgent=True).reason == "critical"
    assert p.pick([c], now, talker_busy=True, talker_urgent=True) is None  # the new stream's step
    assert p.pick([c], now, talker_busy=True, talker_urgent=True).reason == "critical"
    first = StreamState(4, t_submit=2.9, pending=1)
    assert p.pick([c, first], now, talker_busy=True, talker_urgent=True).reason == "first"  # never held


def test_idle_talker_flushes_everything_pending():
    p, now = policy(), 4.0
    s = playing(1, now, slack=2.0, pending=3)
    assert p.pick([s], now, talker_busy=True) is None
    b = p.pick([s], now, talker_busy=False)
    assert b.reason == "idle" and b.frames == 2  # 3 -> bucket 2; the last frame next time


def test_finished_talker_is_flushed_while_the_talker_runs():
    p, now = policy(), 4.0
    s = playing(1, now, slack=2.0, pending=3)
    s.talker_done = True
    assert p.pick([s], now, talker_busy=True).reason == "done"
    first = StreamState(2, 0.0, pending=1, talker_done=True)
    assert policy(first_chunk_frames=2).pick([first], now, talker_busy=True).frames == 1


def test_a_stream_behind_decodes_full_chunks_not_tiny_ones():
    """Critical, but its next chunk (8 frames after two chunks) is not pending yet: it waits for
    the talker rather than costing a codec call per frame."""
    p, now = policy(), 6.0
    s = playing(1, now, slack=-0.2, pending=3, chunks=2)
    assert p.pick([s], now, talker_busy=True) is None
    s.pending = 8
    b = p.pick([s], now, talker_busy=True)
    assert b.reason == "critical" and b.frames == 8
    s.pending, s.talker_done = 3, True  # the talker is done: the rest goes out
    assert p.pick([s], now, talker_busy=True).frames == 2


def test_batch_groups_equal_frame_counts_most_urgent_first_up_to_max_batch():
    now = 7.0
    streams = [
        playing(1, now, slack=0.2, pending=8, chunks=2),  # due: its ramp size is 8
        playing(2, now, slack=0.05, pending=8, chunks=2),  # critical
        playing(3, now, slack=0.15, pending=16, chunks=2),  # due with 16: rides along with 8
        playing(4, now, slack=0.3, pending=9, chunks=2),  # due: 9 -> 8
        playing(5, now, slack=0.2, pending=16, chunks=5),  # its chunk is 16: not with 8
    ]
    b = policy(max_batch=2).pick(streams, now, talker_busy=True)
    assert b.frames == 8 and b.sids == (2, 1)
    assert policy(max_batch=8).pick(streams, now, talker_busy=True).sids == (2, 1, 4, 3)


def test_ride_along_due_takes_streams_below_their_buffer_with_a_smaller_chunk():
    """ride_along due: a call that runs anyway also takes streams whose buffer is below target and
    that have the call's frames pending, though their schedule's chunk is larger; streams with a
    full buffer, or with fewer frames pending, still wait. With schedule (the default) neither
    rides along."""
    now = 7.0
    streams = [
        playing(1, now, slack=0.05, pending=8, chunks=2),  # critical with 8
        playing(2, now, slack=0.3, pending=8, chunks=5),  # chunk 16, buffer below target: rides with due
        playing(3, now, slack=0.2, pending=12, chunks=5),  # chunk 16, 12 pending -> 8: rides with due
        playing(4, now, slack=0.5, pending=8, chunks=5),  # buffer full: waits
        playing(5, now, slack=0.1, pending=4, chunks=5),  # fewer than 8 pending: waits
    ]
    assert policy().pick(streams, now, talker_busy=True).sids == (1,)
    b = policy(ride_along="due").pick(streams, now, talker_busy=True)
    assert b.frames == 8 and b.reason == "critical" and b.sids == (1, 3, 2)
    assert policy(ride_along="due", max_batch=2).pick(streams, now, talker_busy=True).sids == (1, 3)
    # first chunks never take ride-alongs
    first = [StreamState(9, t_submit=6.9, pending=1), playing(2, now, slack=0.3, pending=8, chunks=5)]
    assert policy(ride_along="due").pick(first, now, talker_busy=True).sids == (9,)
    # nor does a stream finishing with fewer frames than half the others' scheduled chunks: its
    # one frame must not cut every stream below target down to one-frame chunks
    ending = [playing(7, now, slack=0.05, pending=1, chunks=5)]
    ending[0].talker_done = True
    ending += [playing(10 + i, now, slack=0.2, pending=20, chunks=5) for i in range(4)]
    b = policy(ride_along="due").pick(ending, now, talker_busy=True)
    assert b.frames == 1 and b.sids == (7,)


def test_finish_pad_decodes_a_finished_streams_rest_in_one_call():
    """finish pad: a stream whose talker is done decodes its rest in one call of the smallest
    frame bucket that holds it (the pipeline pads it), not one call per bucket rounded down;
    above chunk_frames the rest still goes out in chunk_frames pieces. A finished stream with
    fewer frames than a batch's rides along in it; with split (the default) nothing changes."""
    now = 4.0
    s = playing(1, now, slack=2.0, pending=11)
    s.talker_done = True
    assert policy().pick([s], now, talker_busy=True).frames == 8  # 11 -> 8, 2, 1: three calls
    b = policy(finish="pad").pick([s], now, talker_busy=True)
    assert b.reason == "done" and b.frames == 16 and b.sids == (1,)
    assert policy(finish="pad").fit_up(3) == 4 and policy(finish="pad").fit_up(4) == 4
    assert policy(finish="pad").fit_up(40) == 16 and policy(finish="pad").fit_up(0) == 0
    assert policy(frame_buckets=()).fit_up(11) == 11
    s.pending = 1
    assert policy(finish="pad").pick([s], now, talker_busy=True).frames == 1
    # critical and finished: padded too
    c = playing(2, now, slack=0.05, pending=5, chunks=5)
    c.talker_done = True
    b = policy(finish="pad").pick([c], now, talker_busy=True)
    assert b.reason == "critical" and b.frames == 8
    # a finished stream rides along (padded) in a larger batch that runs anyway; an unfinished
    # one with as few frames pending does not
    lead = playing(3, now, slack=0.05, pending=16, chunks=5)  # critical with 16
    done = playing(4, now, slack=1.5, pending=3, chunks=5)
    done.talker_done = True
    short = playing(5, now, slack=0.05, pending=3, chunks=5)
    streams = [lead, done, short]
    assert policy(finish="pad").pick(streams, now, talker_busy=True).sids == (3, 4)
    assert policy().pick(streams, now, talker_busy=True).sids == (3,)


def test_finish_pad_first_ranks_finished_streams_before_due_ones():
    """finish pad_first: a finished stream (large slack: it ran ahead) goes before a due stream
    of its ramp, which split and pad rank first by slack; first chunks and critical streams still
    go before it."""
    now = 5.0
    done = playing(1, now, slack=3.0, pending=16, chunks=6)
    done.talker_done = True
    due = playing(2, now, slack=0.3, pending=4, chunks=1)  # its ramp's 4-frame chunk, buffer below target
    for finish in ("split", "pad"):
        b = policy(finish=finish).pick([done, due], now, talker_busy=True)
        assert b.reason == "due" and b.sids == (2,), finish
    b = policy(finish="pad_first").pick([done, due], now, talker_busy=True)
    assert b.reason == "done" and b.sids == (1,) and b.frames == 16
    crit = playing(3, now, slack=0.05, pending=4, chunks=1)
    first = StreamState(4, t_submit=4.9, pending=2)
    p = policy(finish="pad_first", first_chunk_frames=2)
    assert p.pick([done, due, crit, first], now, talker_busy=True).reason == "first"
    first.chunks, first.pending = 1, 0
    assert p.pick([done, due, crit, first], now, talker_busy=True).reason == "critical"


def test_ahead_decodes_full_buffers_together_once_enough_have_a_whole_chunk():
    """ahead_batch: while the talker runs, streams with a full buffer and a whole chunk pending
    wait until ahead_batch of them have one, then go in one call (reason ahead), after anything
    due and never twice in a row; an idle talker flushes them as before; off (0) they wait."""
    now = 5.0
    full = [playing(i, now, slack=2.0 + i, pending=16, chunks=6) for i in (1, 2)]
    short = playing(3, now, slack=2.5, pending=9, chunks=6)  # less than a whole chunk: not ahead
    assert policy().pick(full + [short], now, talker_busy=True) is None
    p = policy(ahead_batch=3)
    assert p.pick(full + [short], now, talker_busy=True) is None  # two of three
    assert short.t_ready is None and full[0].t_ready is None  # waiting ahead is no scheduling lag
    p = policy(ahead_batch=2)
    b = p.pick(full + [short], now, talker_busy=True)
    assert b.reason == "ahead" and b.frames == 16 and b.sids == (1, 2)
    assert p.pick(full + [short], now, talker_busy=True) is None  # a talker step between
    due = playing(4, now, slack=0.3, pending=16, chunks=6)
    b = policy(ahead_batch=2).pick(full + [due], now, talker_busy=True)
    assert b.reason == "due" and b.sids[0] == 4  # due first; the full buffers ride along (16 frames)
    assert policy(ahead_batch=2).pick(full, now, talker_busy=False).reason == "idle"


def test_settings_are_checked():
    with pytest.raises(ValueError, match="ahead_batch must be an int >= 0"):
        policy(ahead_batch=-1)
    with pytest.raises(ValueError, match="finish must be one of split, pad, pad_first"):
        policy(finish="late")
    with pytest.raises(ValueError, match="ride_along must be one of schedule, due"):
        policy(ride_along="all")
    with pytest.raises(ValueError, match="first_chunk_frames"):
        policy(first_chunk_frames=20)
    with pytest.raises(ValueError, match="urgent_s"):
        policy(urgent_s=0.5)
    with pytest.raises(ValueError, match="frame_buckets must contain 1"):
        policy(frame_buckets=(2, 4))
    assert policy(frame_buckets=(1, 3)).fit(2) == 1
    assert policy().fit(40) == 16 and policy().fit(0) == 0
