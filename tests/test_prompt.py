"""Prompt layout for every task type, language and speaker; validation; embedding.

Uses a tiny deterministic word tokenizer (one id per space-separated word, the real ids for the
chat markers), so that token counts are exact and the tests stay fast. The real Qwen2 tokenizer
is exercised in test_text.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.model.presets import main_config
from triton_qwen3_tts.model.prompt import (
    PromptError,
    PromptLayout,
    PromptRequest,
    build_prompt,
    embed_prompt,
    validate_request,
)

IM_START, IM_END, ASSISTANT, USER, NL = 151644, 151645, 77091, 872, 198
PAD_T, BOS_T, EOS_T = 151671, 151672, 151673
C_PAD, C_BOS, THINK, NOTHINK, THINK_BOS, THINK_EOS = 2148, 2149, 2154, 2155, 2156, 2157


class WordTokenizer:
    """``tok(text)["input_ids"]``: chat markers and newline get the real Qwen ids; every other
    space-separated word gets a stable id in [1000, 60000)."""

    _fixed = {"<|im_start|>": IM_START, "<|im_end|>": IM_END, "\n": NL, "assistant": ASSISTANT, "user": USER}

    def __init__(self):
        self.vocab: dict = {}

    def __call__(self, text):
        out = []
        for piece in re.split(r"(<\|im_start\|>|<\|im_end\|>|\n)", text):
            if piece in self._fixed:
                out.append(self._fixed[piece])
                continue
            for w in piece.split():
                out.append(self._fixed.get(w) or self.vocab.setdefault(w, 1000 + len(self.vocab)))
        return {"input_ids": out}


TOK = WordTokenizer()
TEXT5 = "one two three four five"  # n = 5
REF3 = "alpha beta gamma"  # m = 3
R = 10


def cfg(preset: str, size: str | None = None) -> Qwen3TTSConfig:
    d = main_config(preset)
    if size is not None:
        d["tts_model_size"] = size
    return Qwen3TTSConfig.from_dict(d)


CV = cfg("tiny")
CV_06 = cfg("tiny", "0b6")
CV_17 = cfg("tiny", "1b7")
BASE = cfg("tiny-base")
VD = cfg("tiny-voicedesign")


def codes(r=R, seed=0):
    return np.random.default_rng(seed).integers(0, 2048, size=(r, 16))


def build(c, **kw) -> PromptLayout:
    return build_prompt(c, TOK, PromptRequest(**kw))


# ------------------------------------------------------------------ lengths table


def test_lengths_table():
    lens = {
        "cv_en_stream": build(
            CV, task_type="CustomVoice", text=TEXT5, language="english", speaker="ryan", non_streaming_mode=False
        ).len,
        "cv_auto_stream": build(
            CV, task_type="CustomVoice", text=TEXT5, language="auto", speaker="ryan", non_streaming_mode=False
        ).len,
        "cv_zh_eric_stream": build(
            CV, task_type="CustomVoice", text=TEXT5, language="chinese", speaker="eric", non_streaming_mode=False
        ).len,
        "icl_stream": build(
            BASE,
            task_type="Base",
            text=TEXT5,
            language="english",
            ref_text=REF3,
            ref_codes=codes(),
            non_streaming_mode=False,
        ).len,
        "icl_nonstream": build(
            BASE,
            task_type="Base",
            text=TEXT5,
            language="english",
            ref_text=REF3,
            ref_codes=codes(),
            non_streaming_mode=True,
        ).len,
        "xvec_stream": build(
            BASE, task_type="Base", text=TEXT5, language="english", x_vector_only=True, non_streaming_mode=False
        ).len,
        "xvec_nonstream": build(
            BASE, task_type="Base", text=TEXT5, language="english", x_vector_only=True, non_streaming_mode=True
        ).len,
        # instruction of 2 words -> 3 + 2 + 2 = 7 ids
        "instr7_nonstream": build(
            CV_17,
            task_type="CustomVoice",
            text=TEXT5,
            language="english",
            speaker="ryan",
            instruct="speak softly",
            non_streaming_mode=True,
        ).len,
    }
    assert lens == {
        "cv_en_stream": 10,
        "cv_auto_stream": 9,
        "cv_zh_eric_stream": 10,
        "icl_stream": 20,
        "icl_nonstream": 29,
        "xvec_stream": 10,
        "xvec_nonstream": 16,
        "instr7_nonstream": 23,
    }
    xs = build(BASE, task_type="Base", text=TEXT5, language="english", x_vector_only=True, non_streaming_mode=False)
    assert xs.num_trailing == 5


# ------------------------------------------------------------------ exact rows


def _ids(text):
    return TOK(text)["input_ids"]


def test_customvoice_streaming_rows_exact():
    lay = build(CV, task_type="CustomVoice", text=TEXT5, language="english", speaker="ryan", non_streaming_mode=False)
    x = _ids(TEXT5)
    assert lay.text_ids.tolist() == [IM_START, ASSISTANT, NL, PAD_T, PAD_T, PAD_T, PAD_T, PAD_T, BOS_T, x[0]]
    assert lay.codec_ids.tolist() == [-1, -1, -1, THINK, THINK_BOS, 2050, THINK_EOS, 3061, C_PAD, C_BOS]
    assert lay.ref_frame.tolist() == [-1] * 10
    assert lay.speaker_row == -1 and lay.ref_codes is None and not lay.icl and not lay.non_streaming
    assert lay.trailing_text_ids.tolist() == x[1:] + [EOS_T]
    assert lay.language_id == 2050 and lay.tts_pad_id == PAD_T


def test_customvoice_non_streaming_rows_exact():
    lay = build(CV, task_type="CustomVoice", text=TEXT5, language="auto", speaker="vivian")
    x = _ids(TEXT5)
    assert lay.non_streaming  # official default for CustomVoice
    assert lay.text_ids.tolist() == [IM_START, ASSISTANT, NL, PAD_T, PAD_T, PAD_T, PAD_T, BOS_T] + x + [EOS_T, PAD_T]
    assert lay.codec_ids.tolist() == [-1, -1, -1, NOTHINK, THINK_BOS, THINK_EOS, 3065, C_PAD] + [C_PAD] * 6 + [C_BOS]
    assert lay.trailing_text_ids.tolist() == []
    assert lay.language_id is None


def test_single_token_text_streaming():
    lay = build(CV, task_type="CustomVoice", text="hi", speaker="aiden", non_streaming_mode=False)
    assert lay.text_ids[-1] == _ids("hi")[0] and lay.codec_ids[-1] == C_BOS
    assert lay.trailing_text_ids.tolist() == [EOS_T]


def test_customvoice_without_speaker_has_no_speaker_slot():
    lay = build(CV, task_type="CustomVoice", text=TEXT5, language="english", non_streaming_mode=False)
    assert lay.len == 9
    assert not any(c in lay.codec_ids.tolist() for c in CV.talker.spk_id.values())


def test_icl_streaming_rows_exact():
    rc = codes()
    lay = build(BASE, task_type="Base", text=TEXT5, language="english", ref_text=REF3, ref_codes=rc)
    assert not lay.non_streaming and lay.icl  # official default for Base: streaming
    y = _ids(REF3) + _ids(TEXT5) + [EOS_T]  # 9 < len(Z) = 11 -> pad with tts_pad
    tail_t = y + [PAD_T] * 2
    assert lay.text_ids.tolist() == [IM_START, ASSISTANT, NL] + [PAD_T] * 5 + [BOS_T] + tail_t
    assert lay.codec_ids.tolist() == [-1] * 3 + [THINK, THINK_BOS, 2050, THINK_EOS, -1, C_PAD, C_BOS] + [-1] * R
    assert lay.ref_frame.tolist() == [-1] * 10 + list(range(R))
    assert lay.speaker_row == 7
    assert lay.trailing_text_ids.tolist() == []
    np.testing.assert_array_equal(lay.ref_codes, rc)


def test_icl_streaming_text_longer_than_reference():
    rc = codes(r=3)
    lay = build(BASE, task_type="Base", text=TEXT5, language="auto", ref_text=REF3, ref_codes=rc)
    y = _ids(REF3) + _ids(TEXT5) + [EOS_T]  # 9 > len(Z) = 4
    assert lay.len == 3 + 3 + 1 + 1 + 4
    assert lay.text_ids[-4:].tolist() == y[:4]
    assert lay.codec_ids[-4:].tolist() == [C_BOS, -1, -1, -1]
    assert lay.ref_frame[-4:].tolist() == [-1, 0, 1, 2]
    assert lay.trailing_text_ids.tolist() == y[4:]


def test_icl_non_streaming_rows_exact():
    lay = build(
        BASE, task_type="Base", text=TEXT5, language="german", ref_text=REF3, ref_codes=codes(), non_streaming_mode=True
    )
    y = _ids(REF3) + _ids(TEXT5) + [EOS_T]
    # prefix: role 3 + 4 tags + speaker + codec_pad = 9 rows
    assert lay.text_ids[9:].tolist() == y + [PAD_T] * (R + 1)
    assert lay.codec_ids[9:].tolist() == [C_PAD] * len(y) + [C_BOS] + [-1] * R
    assert lay.ref_frame[9:].tolist() == [-1] * (len(y) + 1) + list(range(R))
    assert lay.codec_ids[5] == 2053 and lay.speaker_row == 7
    assert lay.trailing_text_ids.size == 0


def test_xvector_only_ignores_reference():
    lay = build(BASE, task_type="Base", text=TEXT5, x_vector_only=True, ref_text="ignored", ref_codes=codes())
    assert not lay.icl and lay.ref_codes is None and lay.speaker_row == 6  # auto: 3 tags
    assert (lay.ref_frame == -1).all()
    assert lay.codec_ids[lay.speaker_row] == -1 and lay.text_ids[lay.speaker_row] == PAD_T


def test_voicedesign_instruction_block():
    lay = build(VD, task_type="VoiceDesign", text=TEXT5, instruct="a deep calm voice", language="english")
    ins = _ids("<|im_start|>user\na deep calm voice<|im_end|>\n")
    assert len(ins) == 9
    assert lay.text_ids[:9].tolist() == ins and (lay.codec_ids[:9] == -1).all()
    assert lay.text_ids[9:12].tolist() == [IM_START, ASSISTANT, NL]
    # no speaker slot: 4 tags + codec_pad, then non-streaming tail n + 2
    assert lay.len == 9 + 3 + 5 + 7 and lay.speaker_row == -1
    assert lay.non_streaming


def test_instruction_dropped_on_0b6_customvoice_kept_on_1b7():
    a = build(CV_06, task_type="CustomVoice", text=TEXT5, speaker="ryan", instruct="whisper please")
    b = build(CV_06, task_type="CustomVoice", text=TEXT5, speaker="ryan")
    c = build(CV_17, task_type="CustomVoice", text=TEXT5, speaker="ryan", instruct="whisper please")
    assert a.len == b.len and a.text_ids.tolist() == b.text_ids.tolist()
    assert c.len == b.len + 7


# ------------------------------------------------------------------ every language / speaker


@pytest.mark.parametrize("lang", CV.supported_languages)
@pytest.mark.parametrize("speaker", CV.speakers)
def test_customvoice_every_language_and_speaker(lang, speaker):
    lay = build(
        CV,
        task_type="CustomVoice",
        text=TEXT5,
        language=lang.upper(),
        speaker=f" {speaker.title()} ",
        non_streaming_mode=False,
    )
    dialect = CV.talker.spk_is_dialect[speaker]
    if dialect and lang in ("chinese", "auto"):
        want_tags = [THINK, THINK_BOS, CV.talker.codec_language_id[dialect], THINK_EOS]
    elif lang == "auto":
        want_tags = [NOTHINK, THINK_BOS, THINK_EOS]
    else:
        want_tags = [THINK, THINK_BOS, CV.talker.codec_language_id[lang], THINK_EOS]
    k = len(want_tags)
    assert lay.codec_ids[3 : 3 + k].tolist() == want_tags
    assert lay.codec_ids[3 + k] == CV.talker.spk_id[speaker]
    assert lay.codec_ids[4 + k] == C_PAD and lay.text_ids[4 + k] == BOS_T
    assert lay.text_ids[3 : 4 + k].tolist() == [PAD_T] * (k + 1)
    assert lay.len == 3 + k + 1 + 1 + 1


@pytest.mark.parametrize("speaker,dialect_id", [("eric", 2062), ("dylan", 2074)])
def test_dialect_speakers(speaker, dialect_id):
    for lang in ("auto", "chinese"):
        lay = build(CV, task_type="CustomVoice", text=TEXT5, language=lang, speaker=speaker)
        assert lay.language_id == dialect_id
        assert lay.codec_ids[3:7].tolist() == [THINK, THINK_BOS, dialect_id, THINK_EOS]
    lay = build(CV, task_type="CustomVoice", text=TEXT5, language="english", speaker=speaker)
    assert lay.language_id == 2050 and lay.codec_ids[5] == 2050


@pytest.mark.parametrize("preset,task", [("tiny-base", "Base"), ("tiny-voicedesign", "VoiceDesign")])
def test_every_language_base_and_voicedesign(preset, task):
    c = cfg(preset)
    assert len(c.supported_languages) == 11
    extra = {"x_vector_only": True} if task == "Base" else {"instruct": "warm"}
    for lang in c.supported_languages:
        lay = build(c, task_type=task, text=TEXT5, language=lang, **extra)
        first_tag = int(np.nonzero(lay.codec_ids >= 0)[0][0])
        assert first_tag == (3 if task == "Base" else 6 + 3)  # VoiceDesign: 6-id instruction block first
        if lang == "auto":
            assert lay.language_id is None and lay.codec_ids[first_tag] == NOTHINK
        else:
            assert lay.language_id == c.talker.codec_language_id[lang]
            assert lay.codec_ids[first_tag + 2] == lay.language_id


# ------------------------------------------------------------------ validation


def err(c, **kw) -> PromptError:
    with pytest.raises(PromptError) as ei:
        validate_request(c, PromptRequest(**kw))
    return ei.value


def test_validation_errors_name_field_and_list_values():
    e = err(CV, task_type="Clone", text="x")
    assert e.field == "task_type" and "CustomVoice, VoiceDesign, Base" in str(e)
    e = err(CV, task_type="Base", text="x", x_vector_only=True)
    assert e.field == "task_type" and "CustomVoice" in str(e)
    for bad in ("", "   ", None):
        assert err(CV, task_type="CustomVoice", text=bad).field == "text"
    e = err(CV, task_type="CustomVoice", text="x", speaker="bob")
    assert e.field == "speaker" and all(s in str(e) for s in CV.speakers)
    e = err(CV, task_type="CustomVoice", text="x", language="klingon")
    assert e.field == "language" and all(l in str(e) for l in CV.supported_languages)
    e = err(CV, task_type="CustomVoice", text="x", language="sichuan_dialect")
    assert e.field == "language" and "eric" in str(e) and "english" in str(e)
    e = err(VD, task_type="VoiceDesign", text="x")
    assert e.field == "instruct"
    assert err(VD, task_type="VoiceDesign", text="x", instruct="  ").field == "instruct"
    assert err(VD, task_type="VoiceDesign", text="x", instruct="a", speaker="ryan").field == "speaker"
    assert err(BASE, task_type="Base", text="x").field == "ref_codes"
    assert err(BASE, task_type="Base", text="x", ref_codes=codes()).field == "ref_text"
    assert err(BASE, task_type="Base", text="x", ref_text="r", ref_codes=codes()[:, :8]).field == "ref_codes"
    assert err(BASE, task_type="Base", text="x", ref_text="r", ref_codes=codes() + 2048).field == "ref_codes"
    assert err(BASE, task_type="Base", text="x", ref_text="r", ref_codes=codes().astype(float)).field == "ref_codes"
    assert err(BASE, task_type="Base", text="x", x_vector_only=True, instruct="hi").field == "instruct"
    assert err(CV, task_type="CustomVoice", text="x", ref_text="r").field == "ref_text"
    assert err(CV, task_type="CustomVoice", text="x", x_vector_only=True).field == "x_vector_only"
    assert err(CV, task_type="CustomVoice", text="x", non_streaming_mode="yes").field == "non_streaming_mode"
    assert isinstance(e, ValueError)


def test_validate_normalises():
    r = validate_request(
        CV, PromptRequest(task_type="customvoice", text=" Hi ", language=" English ", speaker="RYAN", instruct="")
    )
    assert (r.task_type, r.text, r.language, r.speaker, r.instruct, r.non_streaming_mode) == (
        "CustomVoice",
        " Hi ",
        "english",
        "ryan",
        None,
        True,
    )
    r = validate_request(CV, PromptRequest(task_type="CustomVoice", text="x", language=None, speaker=""))
    assert r.language == "auto" and r.speaker is None
    r = validate_request(BASE, PromptRequest(task_type="Base", text="x", x_vector_only=True))
    assert r.non_streaming_mode is False
    # idempotent
    assert validate_request(
        CV, validate_request(CV, PromptRequest(task_type="CustomVoice", text="x"))
    ) == validate_request(CV, PromptRequest(task_type="CustomVoice", text="x"))


def test_bad_tokenizer_output_is_caught():
    class Broken:
        def __call__(self, text):
            return {"input_ids": [1, 2, 3]}

    with pytest.raises(PromptError) as ei:
        build_prompt(CV, Broken(), PromptRequest(task_type="CustomVoice", text="x"))
    assert ei.value.field == "text"


# ------------------------------------------------------------------ embedding

torch = pytest.importorskip("torch")


class FakeTalker(torch.nn.Module):
    """Implements the three embedding methods of the talker contract with small tables."""

    def __init__(self, d=8, groups=16):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.text = torch.nn.Embedding(151936, d)
        self.codec = torch.nn.Embedding(3072, d)
        self.frames = torch.nn.ModuleList(torch.nn.Embedding(2048, d) for _ in range(groups - 1))
        for p in self.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g))

    def embed_text(self, ids):
        return self.text(ids) * 2.0  # stand-in for the projection MLP

    def embed_codec(self, ids):
        return self.codec(ids)

    def embed_frame(self, codes):
        out = self.codec(codes[..., 0])
        for j, e in enumerate(self.frames, start=1):
            out = out + e(codes[..., j])
        return out


@torch.no_grad()
def test_embed_prompt_sums_components():
    talker = FakeTalker()
    rc = codes(r=4)
    lay = build(
        BASE, task_type="Base", text=TEXT5, language="english", ref_text=REF3, ref_codes=rc, non_streaming_mode=True
    )
    sv = torch.randn(8)
    emb, trailing = embed_prompt(lay, talker, speaker_vector=sv)
    assert emb.shape == (lay.len, 8) and trailing.shape == (0, 8)
    T = lambda i: talker.embed_text(torch.tensor(i))
    C = lambda i: talker.embed_codec(torch.tensor(i))
    F = lambda k: talker.embed_frame(torch.as_tensor(rc[k]))
    for r in range(lay.len):
        want = torch.zeros(8)
        if lay.text_ids[r] >= 0:
            want = want + T(int(lay.text_ids[r]))
        if lay.codec_ids[r] >= 0:
            want = want + C(int(lay.codec_ids[r]))
        if lay.ref_frame[r] >= 0:
            want = want + F(int(lay.ref_frame[r]))
        if r == lay.speaker_row:
            want = want + sv
        torch.testing.assert_close(emb[r], want, rtol=0, atol=0)
    # spot checks against the layout's formulas (model/prompt.py docstring)
    torch.testing.assert_close(emb[0], T(IM_START), rtol=0, atol=0)
    torch.testing.assert_close(emb[lay.speaker_row], T(PAD_T) + sv, rtol=0, atol=0)
    torch.testing.assert_close(emb[-1], F(3) + T(PAD_T), rtol=0, atol=0)


@torch.no_grad()
def test_embed_prompt_streaming_trailing_and_speaker_checks():
    talker = FakeTalker()
    lay = build(CV, task_type="CustomVoice", text=TEXT5, speaker="ryan", non_streaming_mode=False)
    emb, trailing = embed_prompt(lay, talker)
    x = _ids(TEXT5)
    torch.testing.assert_close(trailing, talker.embed_text(torch.tensor(x[1:] + [EOS_T])), rtol=0, atol=0)
    torch.testing.assert_close(
        emb[-1], talker.embed_text(torch.tensor(x[0])) + talker.embed_codec(torch.tensor(C_BOS)), rtol=0, atol=0
    )
    with pytest.raises(ValueError, match="speaker_vector"):
        embed_prompt(lay, talker, speaker_vector=torch.zeros(8))
    xl = build(BASE, task_type="Base", text=TEXT5, x_vector_only=True)
    with pytest.raises(ValueError, match="speaker_vector"):
        embed_prompt(xl, talker)
    with pytest.raises(ValueError, match="speaker_vector"):
        embed_prompt(xl, talker, speaker_vector=torch.zeros(5))
