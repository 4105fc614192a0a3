"""Parity with the official qwen-tts 0.1.1 implementation, through golden fixtures.

tests/fixtures/golden.{npz,json} were written by the OFFICIAL code (scripts/golden_official.py,
run by scripts/make_golden.py in its own venv; docs/golden.md) on the tiny random checkpoints that
conftest also writes (same presets, same seed, byte-identical files: checked by sha256 below).
Here our implementation runs the same calls and must give:

* prompt embeddings (prefill rows) and the trailing text queue: max-abs <= 1e-4;
* greedy codes (do_sample=False, subtalker_dosample=False): identical, both from our own prompt
  and from the official prompt embeddings (the latter isolates the generation loop);
* decoder waveform for fixed codes: max-abs <= 1e-4;
* speaker embedding (x-vector) of a fixed waveform: max-abs <= 1e-4;
* reference codes (Mimi encoder) of that waveform: identical;
* text token ids of every template string: identical (diagnostic for prompt failures).

Regenerate the fixtures (only when the random-checkpoint bytes change, or to add cases):
``python scripts/make_golden.py``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MANIFEST = FIXTURES / "golden.json"
ARRAYS = FIXTURES / "golden.npz"
ATOL = 1e-4
REGENERATE = "python scripts/make_golden.py"

pytestmark = pytest.mark.skipif(
    not (MANIFEST.exists() and ARRAYS.exists()), reason=f"golden fixtures missing; make them with {REGENERATE}"
)

_MANIFEST = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"cases": []}
CASES = {c["name"]: c for c in _MANIFEST["cases"]}
_CKPT_FIXTURE = {
    "tiny": "tiny_checkpoint",
    "tiny-base": "tiny_base_checkpoint",
    "tiny-voicedesign": "tiny_voicedesign_checkpoint",
}
CONFTEST_SEED = 0  # conftest.TINY_SEED


@pytest.fixture(scope="module")
def golden():
    with np.load(ARRAYS) as z:
        return {k: z[k] for k in z.files}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_same_checkpoint(path: Path, preset: str) -> None:
    want = _MANIFEST.get("generator", {}).get("checkpoint_sha256", {}).get(preset)
    if not want:
        return
    bad = [rel for rel, h in want.items() if not (path / rel).exists() or _sha256(path / rel) != h]
    if bad:
        pytest.fail(
            f"the {preset} random checkpoint is no longer byte-identical to the one the golden "
            f"fixtures were made from (differs: {', '.join(bad)}); the fixtures are stale. "
            f"Regenerate them: {REGENERATE}"
        )


@pytest.fixture(scope="module")
def ckpt(request, tmp_path_factory):
    """``ckpt(preset)`` -> our LoadedCheckpoint (fp32) of the manifest's preset + seed."""
    from triton_qwen3_tts.model.checkpoint import load_checkpoint

    cache = {}

    def get(preset: str):
        if preset not in cache:
            seed = _MANIFEST["checkpoints"][preset]["seed"]
            if seed == CONFTEST_SEED:
                path = Path(request.getfixturevalue(_CKPT_FIXTURE[preset]))
            else:
                from triton_qwen3_tts.tools.random_checkpoint import write_random_checkpoint

                path = tmp_path_factory.mktemp("golden") / preset
                write_random_checkpoint(preset, path, seed, progress=False)
            _check_same_checkpoint(path, preset)
            cache[preset] = load_checkpoint(path, dtype=torch.float32, load_encoder=(preset == "tiny-base"))
        return cache[preset]

    return get


def _maxabs(a, b) -> float:
    a = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    b = torch.as_tensor(np.asarray(b), dtype=torch.float64)
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return float((a - b).abs().max()) if a.numel() else 0.0


def _request(case, golden):
    from triton_qwen3_tts.model.prompt import PromptRequest

    kw = case["kwargs"]
    xvec = bool(kw.get("x_vector_only_mode", False))
    icl = case["task_type"] == "Base" and not xvec
    return PromptRequest(
        task_type=case["task_type"],
        text=kw["text"],
        language=kw.get("language", "auto"),
        speaker=kw.get("speaker"),
        instruct=kw.get("instruct"),
        ref_text=kw.get("ref_text") if icl else None,
        ref_codes=golden[_MANIFEST["ref_codes"]["key"]].astype(np.int64) if icl else None,
        x_vector_only=xvec,
        non_streaming_mode=case["non_streaming_mode"],
    )


def _our_prompt(case, golden, ck):
    """Our (prompt_embeds [L, D], trailing [N, D], tts_pad [D]) for a case. Base cases get the
    official speaker embedding (its own parity is tested separately)."""
    from triton_qwen3_tts.model.prompt import build_prompt, embed_prompt

    layout = build_prompt(ck.config, ck.tokenizer, _request(case, golden))
    spk = None
    if case["task_type"] == "Base":
        spk = torch.from_numpy(golden[_MANIFEST["speaker_embedding"]["key"]])
    with torch.no_grad():
        pe, tr = embed_prompt(layout, ck.model.talker, spk)
        pad = ck.model.talker.embed_text([ck.config.tts_pad_token_id])[0]
    return pe.float(), tr.float(), pad.float()


def _queue(trailing: np.ndarray, pad: np.ndarray, n: int) -> np.ndarray:
    """The text rows added to decode steps 0..n-1: trailing[g], then tts_pad (official rule)."""
    rows = [trailing[g] if g < len(trailing) else pad.reshape(-1) for g in range(n)]
    return np.stack(rows)


def _greedy(ck, max_new_tokens):
    from triton_qwen3_tts.model.sampling import SamplingParams

    return SamplingParams.from_defaults(
        ck.generation, do_sample=False, subtalker_dosample=False, max_new_tokens=max_new_tokens
    )


# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_text_token_ids(name, ckpt):
    from triton_qwen3_tts.model import text as text_mod

    case = CASES[name]
    ck = ckpt(case["checkpoint"])
    kw = case["kwargs"]
    assert text_mod.assistant_text_ids(ck.tokenizer, kw["text"]) == case["input_ids"]
    if case["instruct_ids"] is not None:
        assert text_mod.instruct_ids(ck.tokenizer, kw["instruct"]) == case["instruct_ids"]
    if case["ref_ids"] is not None:
        assert text_mod.ref_text_ids(ck.tokenizer, kw["ref_text"]) == case["ref_ids"]


@pytest.mark.parametrize("name", list(CASES))
def test_prompt_embeddings(name, golden, ckpt):
    case = CASES[name]
    ck = ckpt(case["checkpoint"])
    keys = case["keys"]
    pe, tr, pad = _our_prompt(case, golden, ck)
    want_pe, want_tr, want_pad = golden[keys["prompt_embeds"]], golden[keys["trailing"]], golden[keys["tts_pad_embed"]]
    assert tuple(pe.shape) == want_pe.shape, f"prompt length {pe.shape[0]}, official {want_pe.shape[0]}"
    d_pe = _maxabs(pe.numpy(), want_pe)
    d_pad = _maxabs(pad.numpy(), want_pad)
    n = max(len(tr), len(want_tr)) + 1
    d_tr = _maxabs(_queue(tr.numpy(), pad.numpy(), n), _queue(want_tr, want_pad, n))
    assert d_pe <= ATOL and d_tr <= ATOL and d_pad <= ATOL, (
        f"max-abs: prompt {d_pe:.3g}, trailing queue {d_tr:.3g}, tts_pad {d_pad:.3g}"
    )


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_codes_from_official_prompt(name, golden, ckpt):
    """Our generation loop fed the official prefill/trailing tensors: identical codes."""
    from triton_qwen3_tts.model.generate import generate_codes

    case = CASES[name]
    ck = ckpt(case["checkpoint"])
    keys = case["keys"]
    codes = generate_codes(
        ck.model.talker,
        torch.from_numpy(golden[keys["prompt_embeds"]]),
        torch.from_numpy(golden[keys["trailing"]]),
        torch.from_numpy(golden[keys["tts_pad_embed"]]),
        _greedy(ck, _MANIFEST["greedy"]["max_new_tokens"]),
    )
    want = golden[keys["codes"]].astype(np.int64)
    np.testing.assert_array_equal(codes.numpy(), want)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_codes(name, golden, ckpt):
    """End to end from the request: our prompt + our loop == official greedy codes."""
    from triton_qwen3_tts.model.generate import generate_codes

    case = CASES[name]
    ck = ckpt(case["checkpoint"])
    pe, tr, pad = _our_prompt(case, golden, ck)
    codes = generate_codes(ck.model.talker, pe, tr, pad, _greedy(ck, _MANIFEST["greedy"]["max_new_tokens"]))
    np.testing.assert_array_equal(codes.numpy(), golden[case["keys"]["codes"]].astype(np.int64))


def test_decoder_waveform(golden, ckpt):
    meta = _MANIFEST["decode"]
    ck = ckpt(meta["checkpoint"])
    codes = torch.from_numpy(golden[meta["codes_key"]].astype(np.int64))
    want = golden[meta["wav_key"]]
    with torch.no_grad():
        official_path = ck.decoder.decode_official(codes).numpy()
        whole = ck.decoder.decode(codes[None])[0].numpy()
    d1, d2 = _maxabs(official_path, want), _maxabs(whole, want)
    assert d1 <= ATOL and d2 <= ATOL, f"max-abs: decode_official {d1:.3g}, decode {d2:.3g}"


def test_speaker_embedding(golden, ckpt):
    from triton_qwen3_tts.model.speaker_encoder import extract_speaker_embedding

    meta = _MANIFEST["speaker_embedding"]
    ck = ckpt(meta["checkpoint"])
    emb = extract_speaker_embedding(ck.model.speaker_encoder, golden[meta["wav_key"]])
    d = _maxabs(emb.float().numpy(), golden[meta["key"]])
    assert d <= ATOL, f"speaker embedding max-abs {d:.3g}"


def test_reference_codes(golden, ckpt):
    from triton_qwen3_tts.model.codec_encoder import encode_reference

    meta = _MANIFEST["ref_codes"]
    ck = ckpt(meta["checkpoint"])
    codes = encode_reference(ck.encoder, golden[meta["wav_key"]])
    np.testing.assert_array_equal(codes, golden[meta["key"]].astype(np.int64))
