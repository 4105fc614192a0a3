"""Seeded distribution tests of each engine's sampler against the reference (``model/sampling.py``).

Each engine's own sampling code draws many times from crafted logits, and a chi-square test
compares the counts with the reference probabilities after the official processing (repetition
penalty, min_new_tokens, special-id suppression; then temperature, top-k, top-p):

* native engine: ``NativeModel.sample_c0`` (codebook 0, through the per-slot tables the engine
  fills) and ``NativeModel.sample_residual`` (a code-predictor codebook), with the counter-hashed
  Gumbel noise the engine uses; every row of a batch is an independent draw (its own key);
* vLLM engine: ``TalkerSlotProcessor.apply`` (codebook 0: it turns the logits into a sample that
  vLLM's greedy argmax picks; the input is laid out as ``compute_logits`` returns it) and
  ``sample_rows`` (the code predictor's draws), one seed per row. No vLLM engine is started.

The p-value is the chi-square survival function, ``Q(df / 2, stat / 2)`` (the regularised upper
incomplete gamma, ``torch.special.gammaincc``; scipy is not a dependency). Ids the reference gives
probability 0 must never be drawn; bins whose expected count is under 5 are pooled. A case passes
at p > 1e-4 and, so that the check can fail, a deliberately wrong distribution (one processing
step left out or changed) must be rejected by the same check (p < 1e-8 or a draw outside its
support). Everything is seeded, so the outcome is fixed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from triton_qwen3_tts.model import sampling as ref
from triton_qwen3_tts.model.sampling import SamplingParams

V, CB, EOS = 3072, 2048, 2150  # codebook-0 vocabulary, real codes, EOS (official ids)
CPV = 2048  # a residual codebook's size
N = 8000  # draws per case
BATCH = 500
MIN_NEW = 2


def _logits(seed: int, vocab: int, c0: bool) -> torch.Tensor:
    """A few dozen likely ids among many unlikely ones; for codebook 0 also a few special ids
    with high logits (the suppression must remove them) and EOS."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((vocab,), -12.0) + 0.5 * torch.randn(vocab, generator=g)
    ids = torch.randperm(CB, generator=g)[:40]
    x[ids] = 1.5 * torch.randn(40, generator=g) + 1.0
    if c0:
        x[[2048, 2149, 3000]] = 6.0  # specials: suppressed
        x[EOS] = 1.5
    return x


# name, sampling of the case, history of c0 ids, and the wrong distribution that must be rejected
CASES = {
    "top_k": (dict(temperature=0.9, top_k=10, top_p=1.0), dict(top_k=None)),
    "top_p": (dict(temperature=1.0, top_k=None, top_p=0.7), dict(top_p=1.0)),
    "top_k_top_p": (dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.0)),
    "repetition_penalty": (
        dict(temperature=1.0, top_k=30, top_p=1.0, repetition_penalty=1.8),
        dict(repetition_penalty=1.0),
    ),
}


def _case(name: str, max_top_k: int, vocab: int):
    """The case's params (``top_k=None``: no top-k filter; the engine's largest top-k on an
    engine with a candidate limit, which keeps all ids of non-negligible mass here) and its wrong
    variant."""
    kw, wrong = CASES[name]

    def fix(d):
        d = dict(d)
        if d.get("top_k", 0) is None:
            d["top_k"] = min(max_top_k, vocab)
        return d

    p = fix(kw)
    return p, fix({**p, **wrong})


def _history(logits: torch.Tensor, name: str) -> torch.Tensor:
    """c0 ids sampled so far: none, except for the repetition penalty case (likely ids, with a
    positive and a negative logit, and EOS allowed: more than min_new_tokens were sampled)."""
    if name != "repetition_penalty":
        return torch.zeros(0, dtype=torch.int64)
    top = logits[:CB].argsort(descending=True)
    return torch.stack([top[0], top[2], top[5], top[39]])  # top[39]: a negative logit


def _ref_c0(logits, history, kw) -> torch.Tensor:
    p = SamplingParams(min_new_tokens=MIN_NEW, **kw)
    s = ref.process_c0_logits(logits[None], history[None], history.numel(), p, EOS, CB)
    s = ref.top_p_filter(ref.top_k_filter(ref.apply_temperature(s, p.temperature), p.top_k), p.top_p)
    return torch.softmax(s, -1)[0].double()


def _ref_residual(logits, kw) -> torch.Tensor:
    s = ref.apply_temperature(logits[None], kw["temperature"])
    s = ref.top_p_filter(ref.top_k_filter(s, kw["top_k"]), kw["top_p"])
    return torch.softmax(s, -1)[0].double()


def chi_square(counts: torch.Tensor, probs: torch.Tensor):
    """(p-value, draws outside the support of ``probs``). Bins expected under 5 are pooled."""
    counts, probs = counts.double(), probs.double()
    outside = int(counts[probs == 0].sum())
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs_b = torch.cat([counts[big], counts[~big & (probs > 0)].sum()[None]])
    exp_b = torch.cat([exp[big], exp[~big & (probs > 0)].sum()[None]])
    keep = exp_b > 0
    obs_b, exp_b = obs_b[keep], exp_b[keep]
    stat = ((obs_b - exp_b) ** 2 / exp_b).sum()
    df = obs_b.numel() - 1
    pval = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))
    return pval, outside


def _assert_matches(counts, probs, wrong_probs):
    pval, outside = chi_square(counts, probs)
    assert outside == 0, f"{outside} draws of ids the reference never samples"
    assert pval > 1e-4, f"chi-square p={pval:.3g}: the draws do not follow the reference distribution"
    wp, wout = chi_square(counts, wrong_probs)
    assert wout > 0 or wp < 1e-8, f"the check cannot tell the wrong distribution apart (p={wp:.3g})"


def test_chi_square_statistic_on_known_values():
    # counts exactly as expected: p = 1; a lopsided sample: p tiny; support check
    pv, out = chi_square(torch.tensor([250, 250, 500]), torch.tensor([0.25, 0.25, 0.5]))
    assert pv == pytest.approx(1.0) and out == 0
    pv, _ = chi_square(torch.tensor([400, 100, 500]), torch.tensor([0.25, 0.25, 0.5]))
    assert pv < 1e-10
    # df = 2, stat = 5.991: the 5 % critical value of the chi-square table
    pv, _ = chi_square(torch.tensor([1000 + 54.73, 1000 - 54.73, 2000.0]), torch.tensor([0.25, 0.25, 0.5]))
    assert pv == pytest.approx(0.05, rel=2e-3)
    assert chi_square(torch.tensor([1, 9]), torch.tensor([0.0, 1.0]))[1] == 1


# ---------------------------------------------------------------------------------------------
# native engine
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def native(tiny_checkpoint):
    from triton_qwen3_tts.engines.native.config import NativeEngineConfig
    from triton_qwen3_tts.engines.native.model import NativeModel
    from triton_qwen3_tts.model.checkpoint import load_checkpoint

    ck = load_checkpoint(tiny_checkpoint, dtype=torch.float32, load_speech_tokenizer=False, load_tokenizer=False)
    cfg = NativeEngineConfig(
        max_num_seqs=BATCH,
        max_model_len=4,
        device="cpu",
        dtype="float32",
        cuda_graphs=False,
        batch_buckets=(BATCH,),
        ctx_buckets=(4,),
        max_trailing_tokens=1,
    )
    m = NativeModel(ck.model.talker.eval(), cfg, ck.config.tts_pad_token_id)
    assert (m.V, m.cpV, m.cb, m.eos) == (V, CPV, CB, EOS)
    return m


def _native_rows(m, kw, sub: bool, history=None):
    """Fill the first BATCH slots as the engine's admission does (one request per slot)."""
    B = BATCH
    m.reset_rows(0, B)
    if sub:
        m.sub_greedy[:B] = False
        m.sub_temp[:B] = kw["temperature"]
        m.sub_top_k[:B] = min(kw["top_k"], m.KR)
        m.sub_top_p[:B] = kw["top_p"]
    else:
        m.greedy[:B] = False
        m.temp[:B] = kw["temperature"]
        m.top_k[:B] = min(kw["top_k"], m.K0)
        m.top_p[:B] = kw["top_p"]
        m.rep[:B] = kw.get("repetition_penalty", 1.0)
        m.min_new[:B] = MIN_NEW
        if history is not None and history.numel():
            m.presence[:B, history] = True


def _native_draws(m, logits, kw, sub: bool, history, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    _native_rows(m, kw, sub, history)
    use_top_p = kw["top_p"] < 1.0  # as the engine chooses it (skip_top_p)
    counts = torch.zeros(logits.numel(), dtype=torch.int64)
    B = BATCH
    with torch.inference_mode():
        for _ in range(N // B):
            m.key[:B] = torch.randint(0, 2**32, (B,), generator=g)  # one request per row
            x = logits[None].expand(B, -1).contiguous()
            if sub:
                counters = torch.full((B, 1), 3, dtype=torch.int64)  # frame 0, codebook 3
                noise = m._noise(m.key[:B], counters, m.colsR)[:, 0]
                ids = m.sample_residual(B, x, noise, use_top_p)
            else:
                ngen = torch.full((B,), history.numel(), dtype=torch.int64)
                ids = m.sample_c0(B, x, ngen, use_top_p)
            counts += torch.bincount(ids, minlength=logits.numel())
    return counts


@pytest.mark.parametrize("name", list(CASES))
def test_native_codebook0_distribution(native, name):
    logits = _logits(11, V, c0=True)
    kw, wrong = _case(name, native.cfg.max_top_k, V)
    history = _history(logits, name)
    counts = _native_draws(native, logits, kw, False, history, seed=10 + list(CASES).index(name))
    _assert_matches(counts, _ref_c0(logits, history, kw), _ref_c0(logits, history, wrong))


@pytest.mark.parametrize("name", ["top_k", "top_p", "top_k_top_p"])
def test_native_code_predictor_distribution(native, name):
    logits = _logits(12, CPV, c0=False)
    kw, wrong = _case(name, native.cfg.max_top_k, CPV)
    counts = _native_draws(native, logits, kw, True, None, seed=20 + list(CASES).index(name))
    _assert_matches(counts, _ref_residual(logits, kw), _ref_residual(logits, wrong))


# ---------------------------------------------------------------------------------------------
# vLLM engine (its sampling code, without an engine)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_model():
    from triton_qwen3_tts.engines.vllm import model

    return model


def _vllm_c0_draws(vm, logits, kw, history, seed: int) -> torch.Tensor:
    from triton_qwen3_tts.engines.base import NUM_CHANNEL

    g = torch.Generator().manual_seed(seed)
    proc = vm.TalkerSlotProcessor(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=BATCH)), "cpu", False)
    # compute_logits: special ids (all but EOS) -inf, then the 16 code-channel columns
    sup = torch.zeros(V, dtype=torch.bool)
    sup[CB:] = True
    sup[EOS] = False
    row = torch.cat([logits.masked_fill(sup, float("-inf")), torch.full((NUM_CHANNEL,), -vm.CHANNEL_OFFSET)])
    counts = torch.zeros(V, dtype=torch.int64)
    for _ in range(N // BATCH):
        seeds = torch.randint(0, 2**62, (BATCH,), generator=g).tolist()
        proc.rows = [
            vm._RowParams(
                slot=i,
                out=history.tolist(),
                rep=float(kw.get("repetition_penalty", 1.0)),
                suppress_eos=False,
                min_new=MIN_NEW,
                greedy=False,
                temperature=kw["temperature"],
                top_k=kw["top_k"],
                top_p=kw["top_p"],
                seed=seeds[i],
            )
            for i in range(BATCH)
        ] + [None]
        ids = proc.apply(row[None].repeat(BATCH, 1)).argmax(-1)  # vLLM's greedy pick
        assert int(ids.max()) < V, "a code-channel column was sampled"
        counts += torch.bincount(ids, minlength=V)
    return counts


def _vllm_residual_draws(vm, logits, kw, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(CPV, dtype=torch.int64)
    B = BATCH
    for _ in range(N // B):
        ids = vm.sample_rows(
            logits[None].expand(B, -1),
            torch.full((B,), kw["temperature"]),
            torch.full((B,), kw["top_k"], dtype=torch.int64),
            torch.full((B,), kw["top_p"]),
            torch.zeros(B, dtype=torch.bool),
            torch.randint(0, 2**62, (B,), generator=g),
            torch.zeros(B, dtype=torch.int64),
            3,
        )
        counts += torch.bincount(ids, minlength=CPV)
    return counts


@pytest.mark.parametrize("name", list(CASES))
def test_vllm_codebook0_distribution(vllm_model, name):
    logits = _logits(11, V, c0=True)
    kw, wrong = _case(name, V, V)  # no candidate limit: top_k = V keeps every id
    history = _history(logits, name)
    counts = _vllm_c0_draws(vllm_model, logits, kw, history, seed=30 + list(CASES).index(name))
    _assert_matches(counts, _ref_c0(logits, history, kw), _ref_c0(logits, history, wrong))


@pytest.mark.parametrize("name", ["top_k", "top_p", "top_k_top_p"])
def test_vllm_code_predictor_distribution(vllm_model, name):
    logits = _logits(12, CPV, c0=False)
    kw, wrong = _case(name, CPV, CPV)
    counts = _vllm_residual_draws(vllm_model, logits, kw, seed=40 + list(CASES).index(name))
    _assert_matches(counts, _ref_residual(logits, kw), _ref_residual(logits, wrong))
