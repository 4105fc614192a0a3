import pytest
import torch

from qwen3_tts_triton.config import GenerationDefaults
from qwen3_tts_triton.sampling import SamplingParams, process_c0_logits, warp_and_sample

EOS, CB = 2150, 2048


def test_repetition_penalty_hand_example():
    logits = torch.zeros(1, 3072)
    logits[0, 5], logits[0, 7] = 2.0, -2.0
    out = process_c0_logits(logits, torch.tensor([[5, 7]]), 5, SamplingParams(repetition_penalty=2.0), EOS, CB)
    assert out[0, 5] == 1.0 and out[0, 7] == -4.0 and out[0, 6] == 0.0


def test_min_new_tokens_and_suppression():
    logits = torch.zeros(1, 3072)
    logits[0, EOS] = 100.0
    logits[0, 2500] = 50.0
    p = SamplingParams()
    for n, eos_allowed in [(0, False), (1, False), (2, True)]:
        out = process_c0_logits(logits, torch.zeros(1, 0, dtype=torch.long), n, p, EOS, CB)
        assert torch.isinf(out[0, 2048:EOS]).all() and torch.isinf(out[0, EOS + 1:]).all()
        assert (out[0, EOS] == 100.0) == eos_allowed
        assert int(warp_and_sample(out, False, 1, 1, 1, None)) == (EOS if eos_allowed else 0)
    out = process_c0_logits(logits, torch.zeros(1, 0, dtype=torch.long), 5, p.with_(ignore_eos=True), EOS, CB)
    assert torch.isinf(out[0, EOS])


def test_sampled_ids_within_top_k_and_seeded():
    torch.manual_seed(0)
    logits = torch.randn(4, 2048)
    topk = torch.topk(logits, 5).indices
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(50):
        a = warp_and_sample(logits, True, 0.9, 5, 1.0, g1)
        b = warp_and_sample(logits, True, 0.9, 5, 1.0, g2)
        assert torch.equal(a, b)
        assert all(int(a[i]) in topk[i].tolist() for i in range(4))


def test_greedy_is_argmax():
    logits = torch.randn(3, 100)
    assert torch.equal(warp_and_sample(logits, False, 0.5, 3, 1.0, None), logits.argmax(-1))


def test_top_p_keeps_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(warp_and_sample(logits, True, 1.0, 4, 0.7, g)) for _ in range(200)}
    assert seen == {0, 1}


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=float("nan")), dict(top_k=0),
                                dict(top_p=0.0), dict(repetition_penalty=0.0), dict(max_new_tokens=0)])
def test_validation(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_from_defaults():
    p = SamplingParams.from_defaults(GenerationDefaults.from_dict({"max_new_tokens": 8192, "top_k": 30}), seed=5)
    assert (p.max_new_tokens, p.top_k, p.seed, p.repetition_penalty) == (8192, 30, 5, 1.05)
