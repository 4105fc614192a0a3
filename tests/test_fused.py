"""The fused pipeline on CPU (tiny random checkpoint, fp32, eager): the native engine with the
stateful codec in its loop. Its audio equals the frames of a plain engine run decoded in one
piece by the reference codec (greedy, concurrent streams of different lengths, a Base prefix);
cancel and abort free the talker slot and the codec state; a request the engine refuses fails
alone. The policy itself: tests/test_deadline.py; through tritonserver: test_system_fused.py."""

import asyncio
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from triton_qwen3_tts.engines.base import EngineError, TalkerRequest
from triton_qwen3_tts.engines.native.engine import NativeEngine, NativeEngineConfig
from triton_qwen3_tts.model.stateful_codec import StatefulCodecDecoder
from triton_qwen3_tts.serving.codec.runtime import load_codec_decoder
from triton_qwen3_tts.serving.codec.stateful import StatePool
from triton_qwen3_tts.serving.talker.deadline import DeadlinePolicy
from triton_qwen3_tts.serving.talker.fused import FusedPipeline, frame_buckets

SPF = 1920


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _cfg(**kw):
    return NativeEngineConfig(
        **{
            "max_num_seqs": 4,
            "max_model_len": 96,
            "device": "cpu",
            "dtype": "float32",
            "cuda_graphs": False,
            "batch_buckets": (1, 2, 4),
            "ctx_buckets": (32, 64, 96),
            "max_trailing_tokens": 16,
            **kw,
        }
    )


@pytest.fixture(scope="module")
def decoder(tiny_checkpoint):
    dec, _ = load_codec_decoder(str(tiny_checkpoint), "cpu", torch.float32)
    return dec


@pytest.fixture(scope="module")
def plain(tiny_checkpoint, loop):
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg()))
    yield eng
    eng.shutdown()


def _pipe(tiny_checkpoint, loop, decoder, slots=8, engine_kw=None, first_on_device=True, clock=None, **policy):
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(**(engine_kw or {}))))
    sd = StatefulCodecDecoder(decoder).eval()
    kw = dict(first_chunk_frames=1, ramp=(2, 4), chunk_frames=8, buffer_s=0.4, urgent_s=0.1, max_batch=4)
    kw.update(policy)
    kw["frame_buckets"] = frame_buckets(kw["first_chunk_frames"], kw["ramp"], kw["chunk_frames"])
    pool = StatePool(sd, slots, "cpu", torch.float32, idle_timeout_s=0)
    extra = {} if clock is None else {"clock": clock}
    return FusedPipeline(eng, sd, pool, DeadlinePolicy(**kw), first_on_device=first_on_device, **extra)


@pytest.fixture(scope="module")
def pipe(tiny_checkpoint, loop, decoder):
    p = _pipe(tiny_checkpoint, loop, decoder)
    yield p
    p.shutdown()


def _req(rid, d, frames, seed):
    g = torch.Generator().manual_seed(seed)
    return TalkerRequest(
        request_id=rid,
        prompt_embeds=torch.randn(6, d, generator=g) * 0.05,
        trailing=torch.randn(3, d, generator=g) * 0.05,
        max_frames=frames,
        greedy=True,
        suppress_eos=True,
    )


async def _frames(engine, req):
    out = [f async for f in engine.synthesize(req)]
    return np.concatenate(out) if out else np.zeros((0, 16), np.int32)


async def _audio(pipe, req, prefix=None, stop_after=None):
    chunks = []
    async for a in pipe.synthesize(req, prefix=prefix):
        chunks.append(a)
        if stop_after is not None and len(chunks) >= stop_after:
            break
    return chunks


def _decode(decoder, codes):
    with torch.inference_mode():
        return decoder(torch.as_tensor(codes, dtype=torch.long).T[None]).reshape(-1).float().numpy()


def test_fused_audio_equals_frames_decoded_whole(pipe, plain, decoder, loop):
    lent = pipe.fused_stats.lent
    _check_audio_equals_frames(pipe, plain, decoder, loop)
    assert pipe.fused_stats.lent > lent  # first chunks took their frame from the unread step


@pytest.mark.parametrize(
    "first_on_device,max_batch", [(True, 4), (True, 1), (False, 4)], ids=["on_device", "one_a_call", "read_first"]
)
def test_fused_audio_equals_frames_decoded_whole_first_chunk_of_two(
    tiny_checkpoint, plain, decoder, loop, first_on_device, max_batch
):
    """Two-frame first chunks (the recommended setting): with ``first_on_device`` the chunk's
    first frame comes from the host and its second from the engine's unread step on the device
    (dropped when the engine reads it); without, the engine reads the step first. The same
    audio either way; with one stream a codec call, streams that could take the unread frame but
    are not decoded in that call give it back and get it from the engine."""
    p = _pipe(
        tiny_checkpoint, loop, decoder, first_on_device=first_on_device, first_chunk_frames=2, max_batch=max_batch
    )
    try:
        _check_audio_equals_frames(p, plain, decoder, loop, first=2)
        assert (p.fused_stats.lent > 0) == first_on_device
        assert all(not st.skip for st in p._streams.values())
    finally:
        p.shutdown()


def test_fused_audio_equals_frames_decoded_whole_without_overlap(tiny_checkpoint, plain, decoder, loop):
    """The engine reading each step before the next (``overlap_steps`` off): each codec call's
    audio is read back (a blocking copy) by ``finish`` right after ``run``, with no step launched
    between; the same audio."""
    p = _pipe(tiny_checkpoint, loop, decoder, engine_kw={"overlap_steps": False})
    try:
        assert not p._defer
        _check_audio_equals_frames(p, plain, decoder, loop)
    finally:
        p.shutdown()


def test_fused_audio_equals_frames_decoded_whole_two_steps_unread(tiny_checkpoint, plain, decoder, loop):
    """The engine keeping two launched steps unread (``deep_overlap_rows``): frames reach the
    pipeline a step later, a first chunk takes none from the device while two steps are unread
    (``unread_rows`` is empty then), and the audio is the same."""
    p = _pipe(tiny_checkpoint, loop, decoder, first_chunk_frames=2, engine_kw={"deep_overlap_rows": 1})
    eng = p.engine
    in_flight = []
    launch = eng._launch_step
    eng._launch_step = lambda: in_flight.append(len(eng._inflight)) or launch()
    try:
        _check_audio_equals_frames(p, plain, decoder, loop, first=2)
        assert max(in_flight) == 2  # steps launched behind two unread ones
    finally:
        p.shutdown()


def test_fused_audio_equals_frames_decoded_whole_admitting_after_the_step(tiny_checkpoint, plain, decoder, loop):
    """The engine admitting new requests after launching the running ones' step
    (``admit_after_step``): the streams that wait for a slot join a step later, with the same
    audio; the first chunks still take their last frame on the device."""
    p = _pipe(tiny_checkpoint, loop, decoder, first_chunk_frames=2, engine_kw={"admit_after_step": True})
    try:
        lent = p.fused_stats.lent
        _check_audio_equals_frames(p, plain, decoder, loop, first=2)
        assert p.fused_stats.lent > lent
        calls = p.engine.loop_time.calls  # a late admission adds a second "admit" lap to its iteration
        assert calls["admit"] > calls["release"]
    finally:
        p.shutdown()


def test_fused_audio_equals_frames_decoded_whole_admitting_after_the_codec_call(tiny_checkpoint, plain, decoder, loop):
    """The engine launching the codec call before admitting new requests beside running ones
    (``admit_after_codec``; the order itself: tests/test_native_engine.py): the same audio."""
    p = _pipe(tiny_checkpoint, loop, decoder, first_chunk_frames=2, engine_kw={"admit_after_codec": True})
    try:
        _check_audio_equals_frames(p, plain, decoder, loop, first=2)
    finally:
        p.shutdown()


def test_fused_audio_equals_frames_decoded_whole_admissions_held(tiny_checkpoint, plain, decoder, loop):
    """The engine holding new requests back to admit them together (``admit_hold_ms``; the
    grouping itself: tests/test_native_engine.py): the same audio."""
    p = _pipe(
        tiny_checkpoint,
        loop,
        decoder,
        first_chunk_frames=2,
        engine_kw={"admit_hold_ms": 50.0, "admit_hold_requests": 2},
    )
    try:
        _check_audio_equals_frames(p, plain, decoder, loop, first=2)
    finally:
        p.shutdown()


@pytest.mark.parametrize("finish", ["pad", "pad_first"])
def test_fused_audio_equals_frames_decoded_whole_last_chunks_padded(tiny_checkpoint, plain, decoder, loop, finish):
    """``finish`` pad and pad_first: a finished stream's rest goes out in one call, its codes
    padded to the call's frame count and the padding's audio dropped: the same audio, the
    padding counted apart from the frames decoded."""
    p = _pipe(tiny_checkpoint, loop, decoder, first_chunk_frames=2, finish=finish)
    try:
        _check_audio_equals_frames(p, plain, decoder, loop, first=2)
        st = p.fused_stats
        assert st.padded > 0
        assert st.codec_frames == sum([3, 11, 17, 6, 9])
        assert st.tail.n == 5 and st.first_frame.n == 5 and st.rest.n == 5
    finally:
        p.shutdown()


def test_fused_audio_equals_frames_decoded_whole_full_buffers_decoded_ahead(tiny_checkpoint, plain, decoder, loop):
    """``ahead_batch``: streams whose buffer is full decoded in calls of their own while the
    talker runs: the same audio. The pipeline's clock runs a thousand times slower than the
    wall's, so a stream's first chunk fills its 20-ms buffer target for the whole test and its
    later frames go out only ahead (a whole 8-frame chunk pending) or once its talker is done;
    three long streams, so that none ends (its call taking the others along) before the others
    have a whole chunk pending."""
    p = _pipe(
        tiny_checkpoint,
        loop,
        decoder,
        first_chunk_frames=2,
        buffer_s=0.02,
        urgent_s=0.01,
        ahead_batch=2,
        clock=lambda: time.monotonic() / 1000.0,
    )
    try:
        _check_audio_equals_frames(p, plain, decoder, loop, first=2, lengths=(40, 33, 25))
        assert p.fused_stats.reasons.get("ahead", 0) >= 1, p.fused_stats.reasons
    finally:
        p.shutdown()


def _check_audio_equals_frames(pipe, plain, decoder, loop, first=1, lengths=(3, 11, 17, 6, 9)):
    """Each request's audio through ``pipe`` equals its frames (from ``plain``) decoded whole;
    the default ``lengths``: more streams than talker slots, some wait for a slot."""
    d = plain.hidden
    reqs = [lambda i=i, n=n: _req(f"r{i}", d, n, 100 + i) for i, n in enumerate(lengths)]

    async def both():
        frames = await asyncio.gather(*[_frames(plain, r()) for r in reqs])
        audio = await asyncio.gather(*[_audio(pipe, r()) for r in reqs])
        return frames, audio

    frames, audio = loop.run_until_complete(both())
    for n, f, chunks in zip(lengths, frames, audio):
        assert f.shape == (n, 16)
        assert all(c.dtype == np.float32 and c.size % SPF == 0 and c.size for c in chunks)
        assert chunks[0].size == min(first, n) * SPF  # first chunk: first_chunk_frames
        got = np.concatenate(chunks)
        want = _decode(decoder, f)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    st = pipe.fused_stats
    assert st.chunks >= len(lengths) and st.codec_calls <= st.chunks
    _settle(pipe, loop)
    assert pipe.pool.live == 0 and pipe.engine.stats()["active"] == 0


def test_prefix_primes_codec_state(pipe, plain, decoder, loop):
    d = plain.hidden
    prefix = np.random.default_rng(0).integers(0, 2048, size=(5, 16))
    f = loop.run_until_complete(_frames(plain, _req("p0", d, 7, 7)))
    got = np.concatenate(loop.run_until_complete(_audio(pipe, _req("p1", d, 7, 7), prefix=prefix)))
    want = _decode(decoder, np.concatenate([prefix, f]))[5 * SPF :]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def _settle(pipe, loop):
    """Let the engine loop apply the last close commands (they run in its next iteration)."""

    async def settle():
        for _ in range(500):
            if pipe.engine.stats()["active"] == 0 and pipe.pool.live == 0:
                return
            await asyncio.sleep(0.01)

    loop.run_until_complete(settle())


def test_consumer_leaving_frees_talker_and_codec_state(pipe, loop):
    d = pipe.engine.hidden
    chunks = loop.run_until_complete(_audio(pipe, _req("c0", d, 60, 1), stop_after=1))
    assert len(chunks) == 1
    _settle(pipe, loop)
    assert pipe.engine.stats()["active"] == 0 and pipe.engine.stats()["tracked"] == 0
    assert pipe.pool.live == 0


def test_refused_request_fails_alone(pipe, loop):
    d = pipe.engine.hidden
    bad = _req("bad", d, 5, 2)
    bad.top_k = 0

    async def run():
        ok = asyncio.ensure_future(_audio(pipe, _req("ok", d, 5, 3)))
        with pytest.raises(EngineError, match="top_k"):
            await _audio(pipe, bad)
        return await ok

    assert sum(c.size for c in loop.run_until_complete(run())) == 5 * SPF
    _settle(pipe, loop)
    assert pipe.pool.live == 0


def test_codec_state_capacity_is_unavailable(tiny_checkpoint, loop, decoder):
    from triton_qwen3_tts.serving.codec.stateful import StateCapacityError

    p = _pipe(tiny_checkpoint, loop, decoder, slots=1)
    try:
        d = p.engine.hidden

        async def run():
            return await asyncio.gather(
                _audio(p, _req("a", d, 6, 1)), _audio(p, _req("b", d, 6, 2)), return_exceptions=True
            )

        res = loop.run_until_complete(run())
        errs = [r for r in res if isinstance(r, BaseException)]
        assert len(errs) == 1 and isinstance(errs[0], StateCapacityError)
        ok = [r for r in res if not isinstance(r, BaseException)]
        assert sum(c.size for c in ok[0]) == 6 * SPF
        _settle(p, loop)
        assert p.pool.live == 0
    finally:
        p.shutdown()


class _Cowork:
    """A co-worker of the engine (``engines/native/engine.py``, module docstring) that takes the
    frames and does no work of its own; the tests below override what they watch."""

    frames_to_cowork = True

    def run(self, talker_busy):
        return False

    def on_events(self, events):
        pass

    def has_work(self):
        return False

    def dispatch(self):
        pass


def test_frames_go_only_to_a_cowork_that_takes_them(tiny_checkpoint, loop):
    """A co-worker with ``frames_to_cowork`` gets every frame through ``on_events``, and the
    request's ``synthesize`` yields none: the loop hands no frame to the request's queue (one
    hand-over and coroutine switch per stream and step saved); the request still ends."""

    class Taker(_Cowork):
        def __init__(self):
            self.frames = []

        def on_events(self, events):
            self.frames += [f for _, f, _ in events if f is not None]

    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg()))
    try:
        eng.cowork = taker = Taker()
        req = _req("t1", eng.hidden, 5, seed=3)
        got = loop.run_until_complete(_frames(eng, req))
        assert got.shape == (0, 16)
        assert len(taker.frames) == 5 and all(f.shape == (1, 16) for f in taker.frames)
    finally:
        eng.shutdown()


def test_a_request_whose_first_token_is_eos_ends_without_audio(tiny_checkpoint, loop, decoder):
    """A request that may end on its first token (``min_new_tokens`` 0, EOS not suppressed) and
    does: the engine reports its end in the iteration that admits it, before the pipeline's
    ``run`` has opened its stream; it must still end (no audio), not wait for ever, and leave no
    codec state behind."""
    p = _pipe(tiny_checkpoint, loop, decoder)
    try:
        eng = p.engine
        eng._first_tokens_eos = lambda a, P: [True] * P  # the admission's read finds EOS
        req = replace(_req("eos0", eng.hidden, 20, seed=4), suppress_eos=False, min_new_tokens=0)
        chunks = loop.run_until_complete(asyncio.wait_for(_audio(p, req), timeout=20))
        assert chunks == []
        _settle(p, loop)
        assert p.pool.live == 0 and eng.stats()["tracked"] == 0
    finally:
        p.shutdown()


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_engine_stopped_by_its_task_cancel_ends_open_streams(tiny_checkpoint, loop, loop_thread):
    """Whoever cancels the engine's loop task (an event loop's close cancels every task) ends
    every open request with an error: no stream and no ``abort`` waits for a loop that is gone."""
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(loop_thread=loop_thread)))
    try:

        async def run():
            reqs = [_req(f"c{i}", eng.hidden, 80, seed=i) for i in range(2)]
            tasks = [asyncio.ensure_future(_frames(eng, r)) for r in reqs]
            await asyncio.sleep(0.05)
            eng._task.cancel()
            return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=20)

        outs = loop.run_until_complete(run())
        assert all(isinstance(o, EngineError) and "engine stopped" in str(o) for o in outs), outs
        assert eng.stats()["tracked"] == 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_a_stopped_loop_ends_streams_whose_talker_is_done_but_audio_is_not(tiny_checkpoint, loop, decoder, loop_thread):
    """A stream whose talker request has ended (all its frames generated) while its last audio
    still waits for codec calls: when the engine's loop stops then, the stream ends with the
    engine's error (the engine alone knows no open request of it any more); a later request
    is refused, not queued for a loop that is gone."""
    p = _pipe(tiny_checkpoint, loop, decoder, engine_kw=dict(loop_thread=loop_thread))
    eng = p.engine
    try:
        decode = p.run
        p.run = lambda talker_busy: decode(talker_busy) if p.fused_stats.chunks == 0 else False  # hold the rest

        async def run():
            got = []

            async def consume():
                async for a in p.synthesize(_req("tail", eng.hidden, 6, seed=5)):
                    got.append(a)

            task = asyncio.ensure_future(consume())
            for _ in range(2000):  # the talker request ends; the stream still holds frames
                if p.fused_stats.chunks and eng.stats()["tracked"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert eng.stats()["tracked"] == 0 and not task.done()
            eng._task.cancel()
            out = await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout=20)
            return got, out[0]

        got, err = loop.run_until_complete(run())
        assert len(got) == 1 and isinstance(err, EngineError) and "engine stopped" in str(err), (got, err)
        with pytest.raises(EngineError, match="shut down"):
            loop.run_until_complete(_audio(p, _req("late", eng.hidden, 4, seed=6)))
    finally:
        p.shutdown()


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_shutdown_from_another_thread_ends_the_streams_on_the_engines_event_loop(tiny_checkpoint, loop_thread):
    """As a Triton model's ``finalize`` does: the engine's event loop runs on a thread of its own
    and ``shutdown`` comes from another. Open requests end with the shutdown's error, delivered
    on the engine's event loop (asyncio's queues are not thread-safe), and ``shutdown`` returns."""
    import threading

    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    try:
        eng = asyncio.run_coroutine_threadsafe(
            NativeEngine.create(tiny_checkpoint, _cfg(loop_thread=loop_thread)), lp
        ).result(120)
        on_loop = []

        async def one():
            try:
                return await _frames(eng, _req("x", eng.hidden, 85, seed=1))
            except BaseException as e:  # noqa: BLE001
                on_loop.append(asyncio.get_running_loop() is lp)
                return e

        fut = asyncio.run_coroutine_threadsafe(one(), lp)
        for _ in range(2000):
            if eng.steps > 2:
                break
            time.sleep(0.01)
        eng.shutdown()  # from this thread
        err = fut.result(20)
        assert isinstance(err, EngineError) and "shut down" in str(err), err
        assert on_loop == [True] and eng._task is None
    finally:
        lp.call_soon_threadsafe(lp.stop)
        t.join(10)
        lp.close()


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_a_failing_dispatch_fails_the_streams_instead_of_hanging(tiny_checkpoint, loop, loop_thread):
    """A co-worker whose ``dispatch`` (event loop, after an iteration) raises: every stream ends
    with the error, none waits for events that were never handed over, in either place the
    engine's loop runs."""

    class Broken(_Cowork):
        def dispatch(self):
            raise RuntimeError("injected dispatch failure")

    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(loop_thread=loop_thread)))
    try:
        eng.cowork = Broken()

        async def run():
            reqs = [_req(f"d{i}", eng.hidden, 20, seed=i) for i in range(2)]
            return await asyncio.wait_for(
                asyncio.gather(*(_frames(eng, r) for r in reqs), return_exceptions=True), timeout=30
            )

        outs = loop.run_until_complete(run())
        assert all(isinstance(o, RuntimeError) and "injected dispatch failure" in str(o) for o in outs), outs
    finally:
        eng.shutdown()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "read_each_step"])
def test_unread_rows_name_the_frames_the_next_read_delivers(tiny_checkpoint, loop, overlap):
    """``unread_rows()`` at ``run``: each request's row of the unread step, whose ``model.out``
    codes are the frame ``on_events`` then delivers for it; none once its last frame is read
    (no frame to come) and none without the overlap (every step is read before ``run``)."""

    class Peeker(_Cowork):
        def __init__(self):
            self.peeked, self.got = [], {}

        def run(self, talker_busy):
            rows = eng.unread_rows()
            out = eng.model.out
            # (request, frames it has so far, the peeked codes): the next frame it gets
            self.peeked += [(rid, len(self.got.get(rid, [])), out[i, :16].clone().numpy()) for rid, i in rows.items()]
            return False

        def on_events(self, events):
            for rid, f, _ in events:
                if f is not None:
                    self.got.setdefault(rid, []).append(f[0])

    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(overlap_steps=overlap)))
    try:
        eng.cowork = w = Peeker()
        reqs = [_req(f"u{i}", eng.hidden, n, seed=20 + i) for i, n in enumerate((4, 7))]

        async def both():
            return await asyncio.gather(*[_frames(eng, r) for r in reqs])

        loop.run_until_complete(both())
        if not overlap:
            assert w.peeked == []
            return
        assert len(w.peeked) >= 4 and {rid for rid, _, _ in w.peeked} == {"u0", "u1"}
        for rid, k, codes in w.peeked:  # the frame the next read delivers to that request
            assert k < len(w.got[rid]) and np.array_equal(codes, w.got[rid][k]), (rid, k)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("read_first", [None, True], ids=["overlap", "read_first"])
def test_cowork_read_first_reads_the_step_in_flight_before_run(tiny_checkpoint, loop, read_first):
    """The engine launches a step before reading the previous one; a co-worker's ``read_first``
    makes it read that step (frames to ``on_events``) before asking ``run``. Counted at each
    ``run``: the frames seen so far and the steps still unread."""

    class Watcher(_Cowork):
        def __init__(self):
            self.frames, self.at_run = 0, []

        def run(self, talker_busy):
            self.at_run.append((self.frames, len(eng._inflight)))
            return False

        def on_events(self, events):
            self.frames += sum(f is not None for _, f, _ in events)

    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg()))
    try:
        w = Watcher()
        if read_first:
            w.read_first = lambda ids: bool(ids)
        eng.cowork = w
        loop.run_until_complete(_frames(eng, _req("rf", eng.hidden, 6, seed=4)))
        assert w.frames == 6
        unread = [n for _, n in w.at_run]
        assert max(unread) == (0 if read_first else 1)
        if read_first:  # each run after the first sees every frame launched before it
            assert [f for f, _ in w.at_run[1:]] == list(range(1, len(w.at_run)))
    finally:
        eng.shutdown()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "read_each_step"])
def test_cowork_finish_gets_a_step_launched_behind_its_work(tiny_checkpoint, loop, overlap):
    """A co-worker whose ``run`` launches GPU work and returns True: with ``overlap_steps`` the
    engine launches a decode step before calling its ``finish`` (the GPU gets the step queued
    behind that work); without, ``finish`` follows ``run`` at once and no step runs that
    iteration."""

    class Launcher(_Cowork):
        def __init__(self):
            self.log, self.turn = [], 0

        def run(self, talker_busy):
            self.turn += 1
            mine = talker_busy and self.turn % 3 == 0
            self.log.append("run" if mine else "pass")
            return mine

        def finish(self):
            self.log.append("finish")

    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(overlap_steps=overlap)))
    try:
        eng.cowork = w = Launcher()
        launch = eng._launch_step
        eng._launch_step = lambda: w.log.append("step") or launch()
        loop.run_until_complete(_frames(eng, _req("cf", eng.hidden, 8, seed=5)))
        log = w.log
        runs = [i for i, e in enumerate(log) if e == "run"]
        assert runs and log.count("finish") == len(runs)
        assert log.count("step") == 8  # one per frame either way
        for i in runs:
            assert log[i + 1 : i + 3] == ["step", "finish"] if overlap else log[i + 1] == "finish"
    finally:
        eng.shutdown()


def test_read_first_only_for_a_first_chunk_the_step_completes(pipe, monkeypatch):
    """FusedPipeline.read_first (``first_on_device`` off): True when one more frame completes a
    stream's first chunk."""
    import types

    from triton_qwen3_tts.serving.talker.fused import _Stream
    from triton_qwen3_tts.serving.talker.deadline import StreamState

    first = 3
    monkeypatch.setattr(pipe, "policy", types.SimpleNamespace(first_chunk_frames=first))
    st = _Stream("x", StreamState(999, 0.0))
    pipe._streams["x"] = st
    try:
        st.state.pending = first - 1
        assert not pipe.read_first({"x"})  # first_on_device: run takes the frame on the device
        monkeypatch.setattr(pipe, "_first_on_device", False)
        st.state.pending = first - 2
        assert not pipe.read_first({"x"})
        st.state.pending = first - 1
        assert pipe.read_first({"x"}) and not pipe.read_first({"other"}) and not pipe.read_first(set())
        st.state.chunks = 1  # the first chunk is out
        assert not pipe.read_first({"x"})
        st.state.chunks, st.ended = 0, True
        assert not pipe.read_first({"x"})
    finally:
        pipe._streams.pop("x")


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_loop_overhead_script_runs(tiny_checkpoint, capsys, loop_thread):
    """scripts/loop_overhead.py (host time per scheduler iteration, GPU work taken out; its CPU
    figures are in docs/benchmark-history.md, runs 29 and 34): every stream gets all its audio.
    The streams start together: in the executor they are admitted in one round, so the engine
    steps 30 times; a loop thread admits the first arrival at once and the rest when the event
    loop gets the GIL back to submit them: within a step or two on an idle machine, but its
    steps here cost nothing, so under load (a CI run beside: 60 steps and more) the later streams
    may join after the first has ended. Either way never more steps than one stream after the
    other (90)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "loop_overhead.py"
    spec = importlib.util.spec_from_file_location("loop_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n = torch.get_num_threads()
    try:
        r = mod.run(str(tiny_checkpoint), streams=3, frames=30, loop_thread=loop_thread)
    finally:
        torch.set_num_threads(n)
    assert (r["steps"] == 30 if not loop_thread else 30 <= r["steps"] <= 90) and r["ms_per_iteration"] > 0
    assert r["frames"] == 3 * 30 and r["chunks"] >= 3 * 5  # first chunk, ramp 2, 4, 8, the rest
