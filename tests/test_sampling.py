"""Codebook-0 and residual sampling: each processor on hand-computed examples."""

import math

import pytest
import torch

from triton_qwen3_tts.model.config import GenerationDefaults
from triton_qwen3_tts.model.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    apply_temperature,
    mask_eos_before_min_tokens,
    process_c0_logits,
    sample_c0,
    sample_residual,
    suppress_special_ids,
    top_k_filter,
    top_p_filter,
    warp_and_sample,
)

EOS, CB, V = 2150, 2048, 3072
INF = float("inf")
NO_HISTORY = torch.zeros(1, 0, dtype=torch.long)


def test_repetition_penalty_hand_example():
    logits = torch.tensor([[2.0, -2.0, 0.0, 3.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 1, 1, 2]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 0.0, 3.0]]  # 2/2, -2*2, 0 unchanged, 3 not in history
    assert logits.tolist() == [[2.0, -2.0, 0.0, 3.0]]  # input untouched
    assert apply_repetition_penalty(logits, torch.tensor([[0]]), 1.0).tolist() == logits.tolist()


def test_min_new_tokens_masks_only_eos_and_only_early():
    logits = torch.zeros(1, V)
    for n, masked in [(0, True), (1, True), (2, False), (7, False)]:
        out = mask_eos_before_min_tokens(logits, n, 2, EOS)
        assert (out[0, EOS] == -INF) == masked
        assert (out[0, :EOS] == 0).all() and (out[0, EOS + 1 :] == 0).all()


def test_suppression_keeps_codes_and_eos():
    logits = torch.arange(V, dtype=torch.float32)[None]
    out = suppress_special_ids(logits, CB, EOS)
    assert torch.equal(out[0, :CB], logits[0, :CB]) and out[0, EOS] == EOS
    suppressed = [i for i in range(CB, V) if i != EOS]
    assert len(suppressed) == 1023 and torch.isinf(out[0, suppressed]).all()


def test_temperature_top_k_top_p_hand_examples():
    assert apply_temperature(torch.tensor([[2.0, -4.0]]), 2.0).tolist() == [[1.0, -2.0]]
    assert top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2).tolist() == [[-INF, 3.0, 2.0, -INF]]
    assert top_k_filter(torch.tensor([[1.0, 3.0]]), 50).tolist() == [[1.0, 3.0]]  # k > V keeps all
    probs = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    kept = torch.isfinite(top_p_filter(probs, 0.7))[0].tolist()
    assert kept == [False, True, False, True]  # 0.5 + 0.3 reaches 0.7
    assert torch.isfinite(top_p_filter(probs, 0.01))[0].tolist() == [False, True, False, False]  # >= 1 kept
    assert torch.equal(top_p_filter(probs, 1.0), probs)


def test_process_c0_order_penalty_before_suppression():
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 7], logits[0, EOS], logits[0, 2500] = 2.0, -2.0, 100.0, 50.0
    p = SamplingParams(repetition_penalty=2.0)
    out = process_c0_logits(logits, torch.tensor([[5, 7]]), 2, p, EOS, CB)
    assert (out[0, 5], out[0, 7], out[0, 6], out[0, EOS]) == (1.0, -4.0, 0.0, 100.0)
    assert torch.isinf(out[0, 2500])
    early = process_c0_logits(logits, torch.tensor([[5]]), 1, p, EOS, CB)
    assert torch.isinf(early[0, EOS])
    fixed = process_c0_logits(logits, torch.tensor([[5, 7, 9]]), 3, p.with_(ignore_eos=True), EOS, CB)
    assert torch.isinf(fixed[0, EOS])


def test_greedy_is_argmax_after_processing():
    logits = torch.randn(3, 100)
    assert torch.equal(warp_and_sample(logits, False, 0.5, 3, 1.0), logits.argmax(-1))
    # greedy still applies the repetition penalty and the suppression (as HF does)
    c0 = torch.zeros(1, V)
    c0[0, 10], c0[0, 11], c0[0, 2200] = 1.0, 0.9, 5.0
    p = SamplingParams(do_sample=False, repetition_penalty=2.0)
    assert int(sample_c0(c0, NO_HISTORY, p, EOS, CB)) == 10
    assert int(sample_c0(c0, torch.tensor([[10]]), p, EOS, CB)) == 11  # 1.0 / 2 < 0.9


def test_greedy_min_new_tokens():
    logits = torch.zeros(1, V)
    logits[0, EOS], logits[0, 3] = 10.0, 1.0
    p = SamplingParams(do_sample=False)
    assert [int(sample_c0(logits, torch.zeros(1, n, dtype=torch.long), p, EOS, CB)) for n in range(4)] == [
        3,
        3,
        EOS,
        EOS,
    ]


def test_suppressed_ids_never_sampled():
    logits = torch.full((4, V), -5.0)
    logits[:, CB:] = 10.0  # the specials dominate before suppression
    g = torch.Generator().manual_seed(0)
    p = SamplingParams(temperature=1.0, top_k=3000)
    seen = set()
    for n in range(40):
        ids = sample_c0(logits, torch.zeros(4, n, dtype=torch.long), p, EOS, CB, g)
        seen |= set(ids.tolist())
    assert all(i < CB or i == EOS for i in seen) and EOS in seen


def test_sampled_ids_within_top_k_and_seeded():
    torch.manual_seed(0)
    logits = torch.randn(4, 2048)
    topk = torch.topk(logits, 5).indices
    g1, g2, g3 = (torch.Generator().manual_seed(s) for s in (1, 1, 2))
    a_all, c_all = [], []
    for _ in range(50):
        a = warp_and_sample(logits, True, 0.9, 5, 1.0, g1)
        b = warp_and_sample(logits, True, 0.9, 5, 1.0, g2)
        assert torch.equal(a, b)
        assert all(int(a[i]) in topk[i].tolist() for i in range(4))
        a_all.append(a)
        c_all.append(warp_and_sample(logits, True, 0.9, 5, 1.0, g3))
    assert not torch.equal(torch.stack(a_all), torch.stack(c_all))


def test_temperature_changes_the_distribution():
    logits = torch.log(torch.tensor([[0.6, 0.4]]))
    g = torch.Generator().manual_seed(0)
    hot = sum(int(warp_and_sample(logits, True, 100.0, 2, 1.0, g)) for _ in range(2000)) / 2000
    cold = sum(int(warp_and_sample(logits, True, 0.05, 2, 1.0, g)) for _ in range(2000)) / 2000
    assert abs(hot - 0.5) < 0.05 and cold < 0.01  # frequency of id 1


def test_residual_sampling():
    logits = torch.randn(2, 2048)
    greedy = SamplingParams(subtalker_dosample=False, subtalker_temperature=0.0)
    assert torch.equal(sample_residual(logits, greedy), logits.argmax(-1))
    p = SamplingParams(subtalker_top_k=1)  # top-1 sampling is argmax too, whatever the RNG
    assert torch.equal(sample_residual(logits, p, torch.Generator().manual_seed(3)), logits.argmax(-1))


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=0.0),
        dict(temperature=float("nan")),
        dict(temperature=math.inf),
        dict(subtalker_temperature=-1.0),
        dict(top_k=0),
        dict(top_k=2.5),
        dict(subtalker_top_k=True),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(subtalker_top_p=float("nan")),
        dict(repetition_penalty=0.0),
        dict(max_new_tokens=0),
        dict(min_new_tokens=-1),
        dict(seed="1"),
        dict(do_sample=1),
    ],
)
def test_validation(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_greedy_ignores_temperature():
    SamplingParams(do_sample=False, temperature=0.0, subtalker_dosample=False, subtalker_temperature=0.0)


def test_from_defaults():
    p = SamplingParams.from_defaults(
        GenerationDefaults.from_dict({"max_new_tokens": 8192, "top_k": 30}), seed=5, temperature=None
    )
    assert (p.max_new_tokens, p.top_k, p.seed, p.repetition_penalty, p.temperature) == (8192, 30, 5, 1.05, 0.9)
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        SamplingParams.from_defaults(GenerationDefaults(), topk=3)


def test_gumbel_from_bits_is_finite_at_the_extremes():
    """The largest 24-bit draw gave u = 1.0 in float32 (1 - 2^-25 rounds up), i.e. +inf noise,
    and -inf (a suppressed or top-k-masked logit) + inf = NaN, which argmax picks: CI once saw
    the vLLM talker emit codebook-0 id 2587, a suppressed special id."""
    from triton_qwen3_tts.model.sampling import gumbel_from_bits

    bits = torch.tensor([0, 1, 2**23, 2**24 - 2, 2**24 - 1], dtype=torch.int64)
    old = -torch.log(-torch.log((bits.to(torch.float32) + 0.5) * (1.0 / 16777216.0)))
    assert torch.isinf(old[-1])  # the defect this function removes
    g = gumbel_from_bits(bits)
    assert g.dtype == torch.float32 and bool(torch.isfinite(g).all()), g
    assert bool((g[1:] > g[:-1]).all())  # monotone in the bits
    logits = torch.full((5, 4), float("-inf"))
    logits[:, 2] = 0.0  # the only allowed id
    noise = gumbel_from_bits(torch.tensor([[2**24 - 1] * 4] * 5))
    assert (logits + noise).argmax(-1).tolist() == [2] * 5


def test_talker_request_from_sampling_keeps_every_field():
    from triton_qwen3_tts.engines.base import TalkerRequest

    p = SamplingParams(
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        repetition_penalty=1.3,
        subtalker_dosample=False,
        subtalker_temperature=0.6,
        subtalker_top_k=9,
        subtalker_top_p=0.4,
        max_new_tokens=11,
        seed=5,
    )
    r = TalkerRequest.from_sampling("r", None, None, p)
    assert (r.greedy, r.temperature, r.top_k, r.top_p, r.repetition_penalty) == (False, 0.7, 20, 0.8, 1.3)
    assert (r.sub_greedy, r.sub_temperature, r.sub_top_k, r.sub_top_p) == (True, 0.6, 9, 0.4)
    assert (r.max_frames, r.seed) == (10, 5)
