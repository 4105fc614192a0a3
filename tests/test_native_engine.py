"""NativeEngine on CPU (eager, fp32, tiny random checkpoint): greedy frames identical to the
reference ``generate_codes`` under continuous batching (staggered joins, different lengths),
aborts free their slots, seeded sampling is reproducible, limits are refused."""

import asyncio
import contextlib
import json
import random
import time

import numpy as np
import pytest
import torch

from triton_qwen3_tts.model.checkpoint import load_checkpoint
from triton_qwen3_tts.engines.base import EngineError, TalkerRequest
from triton_qwen3_tts.model.generate import generate_codes
from triton_qwen3_tts.engines.native.engine import (
    NativeEngine,
    NativeEngineConfig,
    _eos_masked_at_prefill,
    gumbel_noise,
    hold_admission,
)
from triton_qwen3_tts.model.sampling import SamplingParams

MAX_LEN = 96


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ref(tiny_checkpoint):
    ck = load_checkpoint(tiny_checkpoint, dtype=torch.float32, load_speech_tokenizer=False, load_tokenizer=False)
    talker = ck.model.talker.eval()
    pad = talker.embed_text(torch.tensor([ck.config.tts_pad_token_id]))[0].detach()
    return talker, pad


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _cfg(**kw):
    base = dict(
        max_num_seqs=4,
        max_model_len=MAX_LEN,
        device="cpu",
        dtype="float32",
        cuda_graphs=False,
        batch_buckets=(1, 2, 4),
        ctx_buckets=(32, 64),
        max_trailing_tokens=16,
    )
    base.update(kw)
    return NativeEngineConfig(**base)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint, loop):
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg()))
    yield eng
    eng.shutdown()


def _prompt(d, L, N, seed):
    g = torch.Generator().manual_seed(seed)
    # scaled like real summed embeddings (std ~0.02 tables): keeps the tiny model's logits varied
    return torch.randn(L, d, generator=g) * 0.05, torch.randn(N, d, generator=g) * 0.05


def _reference(talker, pad, pe, tr, max_frames, **kw):
    p = SamplingParams(do_sample=False, subtalker_dosample=False, max_new_tokens=max_frames + 1, **kw)
    with torch.no_grad():
        return generate_codes(talker, pe, tr, pad, p).numpy().astype(np.int32)


async def _collect(engine, req, abort_after=None):
    chunks, n = [], 0
    async for c in engine.synthesize(req):
        assert c.dtype == np.int32 and c.ndim == 2 and c.shape[1] == 16
        chunks.append(c)
        n += len(c)
        if abort_after is not None and n >= abort_after:
            await engine.abort(req.request_id)
            break
    return np.concatenate(chunks) if chunks else np.zeros((0, 16), np.int32)


async def _staggered(engine, reqs, delays_steps):
    """Start request i once the engine has run ``delays_steps[i]`` decode steps."""

    async def one(r, d):
        while engine.steps < d:
            await asyncio.sleep(0.001)
        return await _collect(engine, r)

    return await asyncio.gather(*(one(r, d) for r, d in zip(reqs, delays_steps)))


def test_config_validation():
    with pytest.raises(EngineError, match="device"):
        NativeEngineConfig(device="tpu")
    with pytest.raises(EngineError, match="dtype"):
        NativeEngineConfig(dtype="float64")
    with pytest.raises(EngineError, match="max_num_seqs"):
        NativeEngineConfig(max_num_seqs=0)
    with pytest.raises(EngineError, match="batch_buckets"):
        NativeEngineConfig(batch_buckets=())
    c = NativeEngineConfig(max_num_seqs=12, max_model_len=1000)
    assert c.batch_sizes() == (1, 2, 4, 8, 12)
    assert c.ctx_sizes() == (256, 512, 1000)
    # prefill: every power of two up to max_num_seqs, whatever the decode buckets
    c = NativeEngineConfig(max_num_seqs=12, max_model_len=64, batch_buckets=(1, 8), prefill_max_tokens=128)
    assert c.batch_sizes() == (1, 8, 12)
    assert c.prefill_batch_sizes() == (1, 2, 4, 8, 12)
    assert c.prefill_len_sizes() == (16, 32, 64)
    assert c.prefill_buckets() == ((1, 16), (2, 16), (4, 16), (8, 16), (1, 32), (2, 32), (4, 32), (1, 64), (2, 64))


def test_greedy_matches_reference_join_and_leave(engine, ref, loop):
    _check_join_and_leave(engine, ref, loop)


@pytest.mark.parametrize(
    "kw",
    [
        dict(fast_math=True),
        dict(fuse_weights=False, skip_top_p=False, batched_prefill=False),
        dict(compile=True, compile_backend="eager"),
        dict(overlap_steps=False),
        dict(deep_overlap_rows=2),
        dict(admit_after_step=True),
        dict(admit_hold_ms=40.0, admit_hold_requests=2, admit_hold_min_rows=2),
        dict(loop_thread=False),
    ],
    ids=[
        "fast_math",
        "unfused",
        "compile_traced",
        "read_each_step",
        "two_unread_from_2_rows",
        "admit_after_step",
        "admit_hold",
        "loop_in_executor",
    ],
)
def test_greedy_matches_reference_engine_variants(tiny_checkpoint, ref, loop, kw):
    """The fast paths (SDPA with is_causal / an additive mask, one-kernel RMSNorm, stacked
    residual gather) and the A/B knobs give the same greedy frames as the reference on CPU fp32.
    ``compile_traced``: the decode blocks go through torch.compile(fullgraph=True) with the
    "eager" backend, so a graph break in them fails here (inductor itself runs on the GPU)."""
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(**kw)))
    try:
        _check_join_and_leave(eng, ref, loop)
    finally:
        eng.shutdown()


def _check_join_and_leave(engine, ref, loop):
    talker, pad = ref
    d = talker.config.hidden_size
    # 6 requests over 4 slots: different prompt / trailing lengths and frame limits, staggered
    # starts, so requests join and leave mid-stream, wait for a slot, and slots get compacted.
    specs = [(9, 3, 14, 0), (5, 0, 6, 0), (17, 7, 20, 2), (3, 12, 9, 3), (12, 1, 11, 5), (7, 4, 8, 7)]
    reqs, wants = [], []
    for i, (L, N, mf, _) in enumerate(specs):
        pe, tr = _prompt(d, L, N, seed=100 + i)
        reqs.append(TalkerRequest(request_id=f"g{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True))
        wants.append(_reference(talker, pad, pe, tr, mf))
    outs = loop.run_until_complete(_staggered(engine, reqs, [s[3] for s in specs]))
    for i, (got, want) in enumerate(zip(outs, wants)):
        assert got.shape == want.shape, (i, got.shape, want.shape)
        np.testing.assert_array_equal(got, want, err_msg=f"request {i}")
        assert len(np.unique(got[:, 1:])) > 8
    assert engine.stats()["active"] == 0 and engine.stats()["waiting"] == 0
    assert max(b for b, _ in engine.step_hist) == 4  # the full bucket was used


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_greedy_burst_batched_prefill(tiny_checkpoint, ref, loop, loop_thread):
    """A simultaneous burst of 6 requests with different prompt lengths over 4 slots: every
    request's greedy frames equal the reference's. With the loop in the event loop's executor the
    first 4 are prefilled as one right-padded batch, the rest as slots free up; with
    ``loop_thread`` the thread admits the first arrival as soon as it is queued, so which of them
    share a prefill depends on timing (their frames must not)."""
    talker, pad = ref
    d = talker.config.hidden_size
    specs = [(4, 2, 9), (19, 0, 7), (11, 5, 12), (2, 9, 6), (15, 3, 8), (8, 1, 10)]
    reqs, wants = [], []
    for i, (L, N, mf) in enumerate(specs):
        pe, tr = _prompt(d, L, N, seed=300 + i)
        reqs.append(TalkerRequest(request_id=f"burst{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True))
        wants.append(_reference(talker, pad, pe, tr, mf))
    engine = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(loop_thread=loop_thread)))
    try:

        async def burst():
            return await asyncio.gather(*(_collect(engine, r) for r in reqs))

        outs = loop.run_until_complete(burst())
        for i, (got, want) in enumerate(zip(outs, wants)):
            np.testing.assert_array_equal(got, want, err_msg=f"request {i}")
        new = engine.prefill_hist
        assert sum(P * n for (P, _, _), n in new.items()) >= 6, new  # every prompt prefilled (padding rows too)
        if not loop_thread:
            assert any(P >= 4 for P, _, _ in new), new  # one batched prefill of the 4 first requests
            assert (4, 19, False) in new, new  # padded to the longest of them (eager on CPU)
        assert engine.stats()["active"] == 0 and engine.stats()["tracked"] == 0
    finally:
        engine.shutdown()


class _ReplayAsCalls:
    """Stands in for the CUDA graphs on CPU: every (B, C, top_p) step and ("prefill", P, L)
    bucket "replays" by calling the captured function, so the bucket selection, padding rows
    (scratch slot) and grouping logic of graph mode run here."""

    def __init__(self, m, cfg):
        self.m = m
        self.graphs = {(b, c, tp): None for b in cfg.batch_sizes() for c in cfg.ctx_sizes() for tp in (False, True)}
        self.graphs.update({("prefill", p, L): None for p, L in cfg.prefill_buckets()})
        self.replayed = []

    def replay(self, key):
        assert key in self.graphs, key
        self.replayed.append(key)
        if key[0] == "prefill":
            self.m.prefill_rows(key[1], key[2])
        else:
            self.m.step(*key)


def test_greedy_prefill_buckets_as_in_graph_mode(tiny_checkpoint, ref, loop):
    """Graph-mode admission on CPU (replays stood in by calls): a burst is grouped by captured
    (P, L) buckets within prefill_max_tokens, padded rows go to the scratch slot, a prompt longer
    than every bucket prefills eagerly, and all greedy frames still equal the reference's."""
    talker, pad = ref
    d = talker.config.hidden_size
    # the loop in the executor: a burst is admitted in one round (a loop thread admits the first
    # arrival at once), so the prefill groups below are deterministic
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(prefill_max_tokens=64, loop_thread=False)))
    try:
        fake = _ReplayAsCalls(eng.model, eng.config)
        eng.graphs, eng.pf_graphs = fake, True
        # first 4: lengths 4, 9, 6 -> bucket (4, 16) with one padding row; 30 -> (1, 32); then
        # 70 (> the largest bucket, 64) -> eager; 12 -> (1, 16) or (2, 16)
        specs = [(4, 2, 9), (9, 0, 7), (6, 5, 12), (30, 9, 6), (70, 3, 5), (12, 1, 10)]
        reqs, wants = [], []
        for i, (L, N, mf) in enumerate(specs):
            pe, tr = _prompt(d, L, N, seed=400 + i)
            reqs.append(TalkerRequest(request_id=f"pb{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True))
            wants.append(_reference(talker, pad, pe, tr, mf))

        async def burst():
            return await asyncio.gather(*(_collect(eng, r) for r in reqs))

        outs = loop.run_until_complete(burst())
        for i, (got, want) in enumerate(zip(outs, wants)):
            np.testing.assert_array_equal(got, want, err_msg=f"request {i}")
        assert eng.prefill_hist.get((4, 16, True)) == 1, eng.prefill_hist
        assert eng.prefill_hist.get((1, 32, True)) == 1, eng.prefill_hist
        assert eng.prefill_hist.get((1, 70, False)) == 1, eng.prefill_hist
        assert any(k[0] != "prefill" for k in fake.replayed)
        assert eng.stats()["active"] == 0 and eng.stats()["tracked"] == 0
    finally:
        eng.shutdown()


@contextlib.contextmanager
def _eos_row_engine(tiny_checkpoint, talker, loop, **kw):
    """A started engine (two slots unless ``kw`` says otherwise) and ``set_row(f)``, which
    replaces the EOS row of its codec head and of the reference ``talker``'s by ``f(row)``; both
    rows restored and the engine shut down after."""
    eng = NativeEngine(tiny_checkpoint, _cfg(**{"max_num_seqs": 2, "batch_buckets": (1, 2), **kw}))
    loop.run_until_complete(eng.start())
    eos = talker.config.codec_eos_token_id
    heads = (eng.model.talker.codec_head.weight, talker.codec_head.weight)
    saved = [h.data[eos].clone() for h in heads]

    def set_row(f) -> None:
        for h in heads:
            h.data[eos] = f(h.data[eos])

    try:
        yield eng, set_row
    finally:
        for h, row in zip(heads, saved):
            h.data[eos] = row
        eng.shutdown()


def test_first_token_eos_only_where_min_new_tokens_allows_it(tiny_checkpoint, ref, loop):
    """An EOS row that wins the prompt's first token: with min_new_tokens 0 that token ends the
    request (no frames; the admission reads it back), with 1 the prefill masks EOS (the
    admission skips that read) and the request runs on, as the reference."""
    from triton_qwen3_tts.engines.native.engine import _eos_masked_at_prefill

    talker, pad = ref
    d = talker.config.hidden_size
    with _eos_row_engine(tiny_checkpoint, talker, loop) as (eng, set_row):
        pe, tr = _prompt(d, 6, 2, seed=11)
        g = torch.Generator().manual_seed(0)
        for _ in range(20):  # an EOS row that wins the prompt's first token by a wide margin
            row = 1e3 * torch.sign(torch.randn(d, generator=g))
            set_row(lambda _: row)
            if len(_reference(talker, pad, pe, tr, 30, min_new_tokens=0)) == 0:
                break
        reads = []
        read = eng._first_tokens_eos
        eng._first_tokens_eos = lambda a, P: reads.append(P) or read(a, P)  # the admission's host read
        for mn in (0, 1):
            reads.clear()
            req = TalkerRequest(
                request_id=f"f{mn}", prompt_embeds=pe, trailing=tr, max_frames=30, greedy=True, min_new_tokens=mn
            )
            assert _eos_masked_at_prefill(req) == (mn >= 1)
            got = loop.run_until_complete(_collect(eng, req))
            want = np.asarray(_reference(talker, pad, pe, tr, 30, min_new_tokens=mn))
            assert (len(want) == 0) == (mn == 0)  # the first token is EOS unless masked
            np.testing.assert_array_equal(got.reshape(-1, 16), want.reshape(-1, 16))
            assert reads == ([1] if mn == 0 else [])  # read back only where EOS can come first


def test_greedy_eos_and_min_new_tokens(tiny_checkpoint, ref, loop):
    """A head biased to EOS: the engine stops exactly where the reference does."""
    talker, pad = ref
    d = talker.config.hidden_size
    with _eos_row_engine(tiny_checkpoint, talker, loop) as (eng, set_row):
        bias = torch.randn(d, generator=torch.Generator().manual_seed(3)) * 0.5
        set_row(lambda r: r + bias)
        outs = []
        for i, mn in enumerate((2, 0, 5)):
            pe, tr = _prompt(d, 6, 2, seed=7 + i)
            want = _reference(talker, pad, pe, tr, 30, min_new_tokens=mn)
            got = loop.run_until_complete(
                _collect(
                    eng,
                    TalkerRequest(
                        request_id=f"e{i}", prompt_embeds=pe, trailing=tr, max_frames=30, greedy=True, min_new_tokens=mn
                    ),
                )
            )
            np.testing.assert_array_equal(got, want)
            outs.append(len(got))
        assert any(n < 30 for n in outs)  # EOS actually stopped some request


@pytest.mark.parametrize(
    "unread, late",
    [(1, False), (2, False), (0, False), (1, True)],
    ids=["overlap", "two_unread", "read_each_step", "admit_after_step"],
)
def test_concurrent_eos_with_steps_in_flight(tiny_checkpoint, ref, loop, unread, late):
    """Requests that stop by EOS at different frames while others decode on, join and wait for a
    slot. With ``overlap_steps`` a step is launched before the previous one is read (with
    ``deep_overlap_rows`` before the two previous ones), so a row whose EOS is read has already
    run one (two) more steps; those frames are dropped and the slot moves behind them. Every
    stream equals the reference either way."""
    talker, pad = ref
    d = talker.config.hidden_size
    with _eos_row_engine(
        tiny_checkpoint,
        talker,
        loop,
        max_num_seqs=4,
        batch_buckets=(1, 2, 4),
        overlap_steps=unread > 0,
        deep_overlap_rows=1 if unread == 2 else 0,
        admit_after_step=late,
    ) as (
        eng,
        set_row,
    ):
        bias = torch.randn(d, generator=torch.Generator().manual_seed(3)) * 0.5
        set_row(lambda r: r + bias)
        in_flight, log = [], []  # log: (loop iteration, "step" | rows active at an admission)
        it = lambda: eng.loop_time.calls.get("release", 0)  # noqa: E731 -- one "release" lap an iteration
        launch, admit = eng._launch_step, eng._admit_many
        eng._launch_step = lambda: in_flight.append(len(eng._inflight)) or log.append((it(), "step")) or launch()
        eng._admit_many = lambda rs: (
            log.append((it(), (len(eng._active), all(_eos_masked_at_prefill(r.req) for r in rs)))) or admit(rs)
        )
        specs = [
            (6, 2, 30, 2, 0),
            (9, 0, 30, 0, 0),
            (4, 3, 12, 5, 1),
            (7, 1, 30, 3, 2),
            (5, 5, 30, 1, 4),
            (8, 2, 9, 0, 6),
        ]
        reqs, wants = [], []
        for i, (L, N, mf, mn, _) in enumerate(specs):
            pe, tr = _prompt(d, L, N, seed=40 + i)
            reqs.append(
                TalkerRequest(
                    request_id=f"c{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True, min_new_tokens=mn
                )
            )
            wants.append(_reference(talker, pad, pe, tr, mf, min_new_tokens=mn))
        outs = loop.run_until_complete(_staggered(eng, reqs, [s[4] for s in specs]))
        for i, (got, want) in enumerate(zip(outs, wants)):
            np.testing.assert_array_equal(got, want, err_msg=f"request {i}")
        ends = [len(w) for w in wants]
        assert any(0 < n < s[2] for n, s in zip(ends, specs))  # EOS stopped some request mid-stream
        assert max(in_flight) == unread  # launched behind that many unread steps
        # beside running requests an admission comes after their step's launch in its iteration
        # with admit_after_step (unless a new request may end at its prefill: min_new_tokens 0),
        # before it without
        beside = [j for j, (_, e) in enumerate(log) if e != "step" and e[0] > 0]
        assert any(log[j][1][1] for j in beside)  # some were admitted while others decoded
        for j in beside:
            stepped = any(e == "step" and i == log[j][0] for i, e in log[:j])
            assert stepped == (late and unread > 0 and log[j][1][1]), (j, log[max(0, j - 3) : j + 2])
        for _ in range(500):  # the loop reads the step launched behind the last EOS, then idles
            if not eng._inflight:
                break
            loop.run_until_complete(asyncio.sleep(0.01))
        assert eng.stats()["active"] == 0 and not eng._inflight


class _LoggingCowork:
    """A co-worker that makes a "codec call" in every iteration and only logs it."""

    frames_to_cowork = False

    def __init__(self, log, iteration):
        self.log, self.iteration = log, iteration

    def on_events(self, events):
        pass

    def run(self, busy):
        self.log.append((self.iteration(), "codec"))
        return True

    def finish(self):
        pass

    def has_work(self):
        return False

    def dispatch(self):
        pass


@pytest.mark.parametrize("after", [False, True], ids=["admit_first", "admit_after_codec"])
def test_admit_after_codec_orders_the_admission_behind_the_codec_call(tiny_checkpoint, ref, loop, after):
    """With ``admit_after_codec`` an admission beside running requests comes after the
    co-worker's codec launch in its iteration (without it, before), and an idle engine's first;
    the new requests join that iteration's step either way, frames equal to the reference. Each
    request is sent once the one before it decodes, and each step takes at least 10 ms, so the
    three are admitted one at a time beside the earlier ones on any CPU."""
    talker, pad = ref
    d = talker.config.hidden_size
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(admit_after_codec=after)))
    log = []  # (loop iteration, "codec" | ("admit", rows decoding) | "step")
    it = lambda: eng.loop_time.calls.get("release", 0)  # noqa: E731 -- one "release" lap an iteration
    eng.cowork = _LoggingCowork(log, it)
    admit, launch = eng._admit_many, eng._launch_step
    eng._admit_many = lambda rs: log.append((it(), ("admit", len(eng._active)))) or admit(rs)
    eng._launch_step = lambda: log.append((it(), "step")) or time.sleep(0.01) or launch()
    reqs, wants = [], []
    for i, mf in enumerate((60, 40, 12)):
        pe, tr = _prompt(d, 5 + i, 2, seed=80 + i)
        reqs.append(
            TalkerRequest(
                request_id=f"a{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True, min_new_tokens=mf
            )
        )
        wants.append(_reference(talker, pad, pe, tr, mf, min_new_tokens=mf))

    async def run():
        tasks = []
        for k, r in enumerate(reqs):
            for _ in range(5000):  # the ones before it decode
                if len(eng._active) >= k and eng.steps >= 2 * k:
                    break
                await asyncio.sleep(0.001)
            tasks.append(asyncio.ensure_future(_collect(eng, r)))
        return await asyncio.wait_for(asyncio.gather(*tasks), 120)

    try:
        outs = loop.run_until_complete(run())
    finally:
        eng.shutdown()
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(got, want)
    admissions = [(j, i, e[1]) for j, (i, e) in enumerate(log) if isinstance(e, tuple)]
    assert [rows for _, _, rows in admissions] == [0, 1, 2], log  # the first one into an idle engine
    for j, i, rows in admissions:
        codec = [k for k, (ik, e) in enumerate(log) if ik == i and e == "codec"]
        step = [k for k, (ik, e) in enumerate(log) if ik == i and e == "step"]
        assert len(codec) == 1 and len(step) == 1, log  # one codec call and one step an iteration
        assert j < step[0]  # the new request joins this iteration's step
        assert (codec[0] < j) == (after and rows > 0), log


def test_hold_admission_rule():
    """``admit_hold_ms``'s rule, pure: off at 0; never while no row decodes; until the oldest
    has waited ``hold_ms`` or ``hold_requests`` wait (as many as the free slots take)."""
    kw = dict(waiting=1, free=8, active=4, waited_ms=5.0)
    assert not hold_admission(0.0, 8, **kw)
    assert hold_admission(20.0, 8, **kw)
    assert not hold_admission(20.0, 8, **{**kw, "active": 0})  # an idle engine admits at once
    assert not hold_admission(20.0, 8, **{**kw, "waited_ms": 20.0})  # held long enough
    assert not hold_admission(20.0, 8, **{**kw, "waiting": 8})  # enough wait
    assert not hold_admission(20.0, 8, **{**kw, "waiting": 3, "free": 3})  # they fill the free slots
    assert hold_admission(20.0, 8, **{**kw, "waiting": 3, "free": 4})
    assert not hold_admission(20.0, 8, **{**kw, "free": 0})  # nothing to admit into anyway
    # admit_hold_min_rows: only while at least that many rows decode
    assert hold_admission(20.0, 8, **kw, min_rows=4)
    assert not hold_admission(20.0, 8, **kw, min_rows=5)  # a lightly loaded engine admits at once
    assert not hold_admission(20.0, 8, **{**kw, "active": 0}, min_rows=0)  # idle: at once, whatever min_rows


def test_admit_hold_groups_admissions(tiny_checkpoint, ref, loop):
    """With ``admit_hold_ms`` new requests that arrive while another decodes are admitted in one
    group once ``admit_hold_requests`` wait, and a lone one after ``admit_hold_ms``, not never;
    a request reaching an idle engine is admitted at once. Frames equal the reference. Each decode
    step is slowed to at least 10 ms, so the long request outlasts the others on any CPU."""
    talker, pad = ref
    d = talker.config.hidden_size
    pe, tr = _prompt(d, 6, 2, seed=70)
    hold_s = 0.3

    def mk(i, mf):
        return TalkerRequest(
            request_id=f"h{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True, min_new_tokens=mf
        )

    async def run(eng):
        groups = []  # (size of each admission, seconds the oldest of it waited, rows decoding)
        admit, launch = eng._admit_many, eng._launch_step

        def logged(rs):
            groups.append((len(rs), time.perf_counter() - min(r.t_submit for r in rs), len(eng._active)))
            return admit(rs)

        eng._admit_many = logged
        eng._launch_step = lambda: time.sleep(0.01) or launch()
        long = asyncio.ensure_future(_collect(eng, mk(0, 85)))  # decodes while the others arrive
        for _ in range(5000):
            if eng.steps >= 2 or long.done():
                break
            await asyncio.sleep(0.001)
        b = asyncio.ensure_future(_collect(eng, mk(1, 6)))
        await asyncio.sleep(0.01)
        c = asyncio.ensure_future(_collect(eng, mk(2, 6)))
        got = await asyncio.wait_for(asyncio.gather(b, c), 60)
        got.append(await asyncio.wait_for(_collect(eng, mk(3, 6)), 60))  # alone: waits hold_s
        await asyncio.wait_for(long, 60)
        return groups, got

    eng = loop.run_until_complete(
        NativeEngine.create(tiny_checkpoint, _cfg(admit_hold_ms=hold_s * 1000, admit_hold_requests=2))
    )
    try:
        groups, outs = loop.run_until_complete(run(eng))
    finally:
        eng.shutdown()
    want = _reference(talker, pad, pe, tr, 6, min_new_tokens=6)
    for got in outs:
        np.testing.assert_array_equal(got, want)
    assert [n for n, _, _ in groups] == [1, 2, 1], groups
    assert groups[0][1] < hold_s and groups[0][2] == 0  # the idle engine admitted the first at once
    assert groups[1][1] >= 0.01 and groups[1][2] == 1  # the second waited for the third
    assert groups[2][1] >= hold_s and groups[2][2] == 1  # a lone one after the hold, beside the long one


def test_admit_hold_min_rows_admits_at_once_below_it(tiny_checkpoint, ref, loop):
    """With ``admit_hold_min_rows`` 2 a request arriving while one row decodes is admitted at
    once, not after ``admit_hold_ms`` (a second long one): the hold is for a busy engine only."""
    talker, pad = ref
    pe, tr = _prompt(talker.config.hidden_size, 6, 2, seed=71)
    hold_s = 1.0

    def mk(i, mf):
        return TalkerRequest(
            request_id=f"m{i}", prompt_embeds=pe, trailing=tr, max_frames=mf, greedy=True, min_new_tokens=mf
        )

    async def run(eng):
        waits = []  # (seconds the oldest of each admission waited, rows decoding)
        admit, launch = eng._admit_many, eng._launch_step

        def logged(rs):
            waits.append((time.perf_counter() - min(r.t_submit for r in rs), len(eng._active)))
            return admit(rs)

        eng._admit_many = logged
        eng._launch_step = lambda: time.sleep(0.01) or launch()
        long = asyncio.ensure_future(_collect(eng, mk(0, 85)))
        for _ in range(5000):
            if eng.steps >= 2 or long.done():
                break
            await asyncio.sleep(0.001)
        got = await asyncio.wait_for(_collect(eng, mk(1, 6)), 60)
        await asyncio.wait_for(long, 60)
        return waits, got

    cfg = _cfg(admit_hold_ms=hold_s * 1000, admit_hold_requests=8, admit_hold_min_rows=2)
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, cfg))
    try:
        waits, got = loop.run_until_complete(run(eng))
    finally:
        eng.shutdown()
    np.testing.assert_array_equal(got, _reference(talker, pad, pe, tr, 6, min_new_tokens=6))
    assert len(waits) == 2 and waits[1][1] == 1, waits  # admitted beside the long one
    assert waits[1][0] < hold_s / 2, waits  # at once, not after the hold


def test_aborts_free_slots(engine, ref, loop):
    talker, _ = ref
    d = talker.config.hidden_size
    rng = random.Random(5)

    async def run():
        async def one(i):
            pe, tr = _prompt(d, rng.randrange(2, 20), rng.randrange(0, 8), seed=i)
            r = TalkerRequest(
                request_id=f"ab{i}",
                prompt_embeds=pe,
                trailing=tr,
                max_frames=rng.randrange(2, 10),
                seed=i,
                suppress_eos=True,
            )
            await asyncio.sleep(rng.random() * 0.02)
            return await _collect(engine, r, abort_after=rng.choice([1, 2, 3]))

        return await asyncio.gather(*(one(i) for i in range(20)))

    outs = loop.run_until_complete(run())
    assert len(outs) == 20 and all(1 <= len(o) for o in outs)
    loop.run_until_complete(asyncio.sleep(0.05))
    st = engine.stats()
    assert st["active"] == 0 and st["waiting"] == 0 and st["tracked"] == 0 and st["free"] == 4
    # the engine still serves exact greedy requests after all the aborts
    pe, tr = _prompt(d, 8, 2, seed=99)
    got = loop.run_until_complete(
        _collect(engine, TalkerRequest(request_id="after", prompt_embeds=pe, trailing=tr, max_frames=5, greedy=True))
    )
    np.testing.assert_array_equal(got, _reference(talker, ref[1], pe, tr, 5))


def test_abort_waiting_and_closed_stream(engine, ref, loop):
    talker, _ = ref
    d = talker.config.hidden_size

    async def run():
        pe, tr = _prompt(d, 4, 0, seed=1)
        gens = [
            engine.synthesize(
                TalkerRequest(
                    request_id=f"w{i}", prompt_embeds=pe, trailing=tr, max_frames=40, seed=i, suppress_eos=True
                )
            )
            for i in range(6)
        ]
        firsts = await asyncio.gather(*(g.__anext__() for g in gens[:4]))
        assert all(len(f) >= 1 for f in firsts)
        t5 = asyncio.ensure_future(gens[5].__anext__())
        await asyncio.sleep(0.01)
        await engine.abort("w5")  # may still be waiting for a slot
        for g in gens[:4]:
            await g.aclose()  # closing a stream aborts its request
        try:
            await asyncio.wait_for(t5, 5)
        except StopAsyncIteration:
            pass
        await gens[4].aclose()

    loop.run_until_complete(run())
    loop.run_until_complete(asyncio.sleep(0.05))
    st = engine.stats()
    assert st["active"] == 0 and st["waiting"] == 0 and st["tracked"] == 0


@pytest.mark.parametrize("loop_thread", [False, True], ids=["executor", "loop_thread"])
def test_failed_step_fails_every_stream_and_later_requests(tiny_checkpoint, ref, loop, loop_thread):
    """A decode step that raises ends every stream in flight with the error (none hangs), in
    either place the loop runs, and a later request is refused with it."""
    talker, _ = ref
    d = talker.config.hidden_size
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(loop_thread=loop_thread)))
    step, calls = eng.model.step, []

    def failing(*a):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("injected step failure")
        return step(*a)

    eng.model.step = failing
    pe, tr = _prompt(d, 6, 2, seed=7)

    async def run():
        reqs = [
            TalkerRequest(request_id=f"f{i}", prompt_embeds=pe, trailing=tr, max_frames=40, seed=i, suppress_eos=True)
            for i in range(3)
        ]
        return await asyncio.wait_for(
            asyncio.gather(*(_collect(eng, r) for r in reqs), return_exceptions=True), timeout=30
        )

    try:
        outs = loop.run_until_complete(run())
        assert all(isinstance(o, RuntimeError) and "injected step failure" in str(o) for o in outs), outs
        with pytest.raises(RuntimeError, match="native engine failed"):
            loop.run_until_complete(_collect(eng, TalkerRequest(request_id="late", prompt_embeds=pe, trailing=tr)))
        assert eng.stats()["tracked"] == 0
    finally:
        eng.shutdown()


def test_seeded_sampling_reproducible(engine, ref, loop):
    talker, _ = ref
    d = talker.config.hidden_size
    pe, tr = _prompt(d, 7, 3, seed=11)

    def req(rid, seed, **kw):
        return TalkerRequest(
            request_id=rid, prompt_embeds=pe, trailing=tr, max_frames=10, seed=seed, suppress_eos=True, **kw
        )

    async def three():
        return await asyncio.gather(
            _collect(engine, req("s-a", 7)), _collect(engine, req("s-b", 7)), _collect(engine, req("s-c", 8))
        )

    a, b, c = loop.run_until_complete(three())
    alone = loop.run_until_complete(_collect(engine, req("s-d", 7)))  # batch of one: same frames
    assert a.shape == (10, 16)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, alone)
    assert not np.array_equal(a, c)
    assert a.min() >= 0 and a.max() < 2048

    # a batch running the top-p variant (another request has top_p < 1) samples a top_p = 1
    # request exactly as a batch without it does
    async def with_top_p():
        return await asyncio.gather(_collect(engine, req("s-e", 7)), _collect(engine, req("s-f", 9, top_p=0.5)))

    e, f = loop.run_until_complete(with_top_p())
    np.testing.assert_array_equal(e, a)
    assert f.shape == (10, 16)
    # top_k=1 sampling is greedy
    g1 = loop.run_until_complete(_collect(engine, req("k1", 3, top_k=1, sub_top_k=1)))
    g0 = loop.run_until_complete(_collect(engine, req("k0", 3, greedy=True)))
    np.testing.assert_array_equal(g1, g0)


def test_gumbel_noise_distribution():
    key = torch.tensor([5, 6], dtype=torch.int64)
    g = gumbel_noise(key, torch.tensor([0, 0]), torch.arange(4096))
    assert torch.isfinite(g).all()
    assert abs(float(g.mean()) - 0.5772) < 0.06 and abs(float(g.std()) - 1.2825) < 0.06
    assert not torch.equal(g[0], g[1])
    assert torch.equal(g, gumbel_noise(key, torch.tensor([0, 0]), torch.arange(4096)))


def test_limits_refused(engine, ref, loop):
    talker, _ = ref
    d = talker.config.hidden_size

    async def first(req):
        async for _ in engine.synthesize(req):
            break

    def bad(match, field=None, **kw):
        args = dict(request_id="bad", prompt_embeds=torch.zeros(4, d), max_frames=4)
        args.update(kw)
        with pytest.raises(EngineError, match=match) as e:
            loop.run_until_complete(first(TalkerRequest(**args)))
        if field is not None:  # the talker/tts input the refusal names (INVALID_ARG's field)
            assert e.value.field == field

    bad("too long", prompt_embeds=torch.zeros(MAX_LEN - 1, d))
    bad("exceeds max_model_len", max_frames=MAX_LEN - 4)
    bad("prompt_embeds must be", prompt_embeds=torch.zeros(4, d + 1))
    bad("max_trailing_tokens", trailing=torch.zeros(17, d))
    bad("max_frames", max_frames=0)
    bad("temperature", temperature=0.0)
    bad(r"top_k must be in \[1, 64\].*max_top_k", "top_k", top_k=100)
    bad(r"subtalker_top_k must be in \[1, 64\]", "subtalker_top_k", sub_top_k=65)
    bad("subtalker_temperature", "subtalker_temperature", sub_temperature=0.0)
    bad("subtalker_top_p", "subtalker_top_p", sub_top_p=0.0)
    bad("top_p", "top_p", top_p=1.5)
    bad("repetition_penalty", "repetition_penalty", repetition_penalty=0.0)
    # the longest allowed request runs
    got = loop.run_until_complete(
        _collect(
            engine,
            TalkerRequest(
                request_id="edge",
                prompt_embeds=torch.zeros(MAX_LEN - 2, d),
                max_frames=1,
                greedy=True,
                suppress_eos=True,
            ),
        )
    )
    assert got.shape == (1, 16)
    assert engine.stats()["tracked"] == 0


def test_padding_rows_do_not_advance(tiny_checkpoint, ref, loop):
    """With one bucket of 4, a lone request pads rows 1..3 with free slots at every step. Those
    rows must not advance: requests one after another run far more steps in total than
    ``max_model_len``, and a free slot whose position walked past it indexed the RoPE table and
    the KV cache out of bounds (a device-side assert on the GPU, an IndexError here)."""
    talker, pad = ref
    d = talker.config.hidden_size
    eng = loop.run_until_complete(NativeEngine.create(tiny_checkpoint, _cfg(batch_buckets=(4,))))
    try:
        total = 0
        for i in range(4):  # 4 x 40 steps > MAX_LEN = 96
            pe, tr = _prompt(d, 8, 3, seed=900 + i)
            req = TalkerRequest(
                request_id=f"pad{i}", prompt_embeds=pe, trailing=tr, max_frames=40, greedy=True, suppress_eos=True
            )
            got = loop.run_until_complete(_collect(eng, req))
            assert got.shape == (40, 16)
            total += len(got)
            assert int(eng.model.pos[1:4].abs().max()) == 0, eng.model.pos[:4]
        assert total > MAX_LEN and eng.stats()["active"] == 0
        # and the engine still computes exact greedy frames
        pe, tr = _prompt(d, 8, 2, seed=99)
        got = loop.run_until_complete(
            _collect(
                eng, TalkerRequest(request_id="pad-after", prompt_embeds=pe, trailing=tr, max_frames=5, greedy=True)
            )
        )
        np.testing.assert_array_equal(got, _reference(talker, pad, pe, tr, 5))
    finally:
        eng.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_engines_on_two_gpus_in_one_process_capture_on_their_own_devices(tiny_checkpoint, ref):
    """Two engines with CUDA graphs in one process, cuda:0 then cuda:1, each on an event loop
    whose threads' current device is its own (``fused_workers`` thread runs them so): the second
    engine captures on its own device's stream (torch.cuda.graph's default capture stream is made
    once per process, on the first capture's device), and both give the same greedy frames."""
    from triton_qwen3_tts.serving.talker.service import DeviceLoop

    talker, _ = ref
    pe, tr = _prompt(talker.config.hidden_size, 9, 3, seed=7)
    loops, engines, outs = [], [], []
    try:
        for i in range(2):
            dl = DeviceLoop(f"cuda:{i}", name=f"test-gpu{i}")
            loops.append(dl)
            cfg = _cfg(device=f"cuda:{i}", cuda_graphs=True)
            engines.append(dl.run(NativeEngine.create(tiny_checkpoint, cfg)))
        for i, (dl, eng) in enumerate(zip(loops, engines)):
            req = TalkerRequest(request_id=f"two{i}", prompt_embeds=pe, trailing=tr, max_frames=12, greedy=True)
            outs.append(dl.run(_collect(eng, req)))
    finally:
        for dl, eng in zip(loops, engines):
            eng.shutdown()
        for dl in loops:
            dl.close()
    assert outs[0].shape == (12, 16)
    np.testing.assert_array_equal(outs[1], outs[0])


def test_stats_time_each_kind_of_launch(engine, ref, loop):
    """On the CPU the engine times its launches with the host clock (the work is synchronous):
    after a request, its prefill and the steps of its batch bucket are counted."""
    talker, pad = ref
    before = engine.stats()["gpu_ms"]
    pe, tr = _prompt(talker.config.hidden_size, 5, 2, seed=41)
    loop.run_until_complete(
        _collect(engine, TalkerRequest(request_id="timed", prompt_embeds=pe, trailing=tr, max_frames=3, greedy=True))
    )
    after = engine.stats()["gpu_ms"]
    assert after["prefill"]["calls"] == before.get("prefill", {}).get("calls", 0) + 1
    steps = sum(v["calls"] for k, v in after.items() if k.startswith("step_b"))
    assert steps >= sum(v["calls"] for k, v in before.items() if k.startswith("step_b")) + 3
    assert all(v["ms"] >= 0 and v["mean_ms"] >= 0 for v in after.values())
    # the loop's host time per phase: every iteration passed through each phase of _work, and
    # the reads waited for their steps
    loop_ms = engine.stats()["loop_ms"]
    for phase in ("between", "release", "admit", "read_first_tell", "cowork_launch", "step_launch", "read", "tell"):
        assert loop_ms[phase]["calls"] >= steps and loop_ms[phase]["ms"] >= 0, phase
    assert loop_ms["wait_step"]["calls"] >= 3
    # the admission in parts: the slots' rows, the group's prompts, the prefill's launch
    for part in ("admit_rows", "admit_prompts", "admit_prefill"):
        assert loop_ms[part]["calls"] >= 1 and loop_ms[part]["ms"] >= 0, part


def test_slot_reset_and_move_touch_every_table_and_only_their_rows(engine):
    """reset_slot / reset_rows / move_slot run one multi-tensor op per dtype group: every state
    table's row is zeroed or moved, the other rows are untouched (5 rows: 4 slots + scratch)."""
    m = engine.model
    assert m.state[0].shape[0] == 5
    groups = [t for g in m._state_groups for t in g]
    assert sorted(map(id, groups)) == sorted(map(id, m.state))  # each table in one group
    g = torch.Generator().manual_seed(11)
    with torch.inference_mode():
        for t in m.state:
            if t.dtype == torch.bool:
                t.copy_(torch.rand(t.shape, generator=g) < 0.5)
            elif t.dtype.is_floating_point:
                t.copy_(torch.rand(t.shape, generator=g).to(t.dtype) + 0.5)
            else:
                t.copy_(torch.randint(1, 100, t.shape, generator=g))
        before = [t.clone() for t in m.state]
        m.move_slot(3, 1, 0)
        for t, b in zip(m.state, before):
            assert torch.equal(t[1], b[3])
            assert torch.equal(t[0], b[0]) and torch.equal(t[2:], b[2:])
        m.reset_slot(4)
        m.reset_rows(2, 4)
        for t, b in zip(m.state, before):
            assert not t[2:5].any()
            assert torch.equal(t[0], b[0]) and torch.equal(t[1], b[3])
        m.reset_all()  # the engine's free slots are zeros (other tests share it)


def test_admission_profile_script_runs(tiny_checkpoint, tmp_path):
    """scripts/admission_profile.py (an admission's host time behind a decode step) drives the
    engine's own admission by hand on the CPU: one result per case and prompt count, each with
    its host time and timed parts (no GPU step time on the CPU)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "admission_profile.py"
    spec = importlib.util.spec_from_file_location("admission_profile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "a.json"
    n = torch.get_num_threads()
    try:
        args = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--prompts", "1", "3"]
        assert mod.main(args + ["--repeat", "2", "--rows", "2", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(n)
    res = json.loads(out.read_text())
    assert [(r["pinned_prompts"], r["busy_thread"], r["prompts"]) for r in res] == [
        (p, b, k) for p in (False, True) for b in (False, True) for k in (1, 3)
    ]
    for r in res:
        parts = r["admit_rows_ms_p50"] + r["admit_prompts_ms_p50"] + r["admit_prefill_ms_p50"]
        assert r["host_ms_p50"] > 0 and parts > 0 and r["step_gpu_ms_p50"] is None
