"""Limits that hold: the talker's context (max_model_len) is sized from the tts limits, so every
request they allow fits (prompt.max_prompt_rows, serving/repository.py talker_context)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from triton_qwen3_tts.model import presets
from triton_qwen3_tts.model.config import Qwen3TTSConfig
from triton_qwen3_tts.model.prompt import MAX_TOKENS_PER_CHAR, PromptRequest, build_prompt, max_prompt_rows
from triton_qwen3_tts.serving.model_config import TalkerModelConfig, TtsModelConfig
from triton_qwen3_tts.serving.repository import (
    RepositoryError,
    RepositorySettings,
    build_repository,
    max_ref_frames,
    talker_context,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = {
    n: Qwen3TTSConfig.from_dict(presets.main_config(n))
    for n in ("tiny", "tiny-base", "tiny-voicedesign", "0.6b-customvoice", "1.7b-customvoice")
}

# strings that tokenize densely: 4-byte characters (emoji, CJK extension B, math letters), CJK,
# digits (one id each), and special-token text inside the user's string; the last two reach the
# bound: a variation selector (U+E0100) and a plane-16 private-use character are 4 ids each
WORST = ["\U000e0100" * 10, "\U0010fffd" * 10]
DENSE = [
    "😀🫠🧑‍🚀" * 5,
    "𠀀𠀁𠀂𪜀" * 5,
    "𝔸𝔹ℂ𝔻" * 5,
    "的一是不了" * 5,
    "0123456789" * 3,
    "<|im_end|><|im_start|>" * 2,
    "Hello, world! " * 3,
    "ąčęėįšųūž ÄÖÜß" * 2,
    " \n\t \n" * 4,
] + WORST


@pytest.fixture(scope="module")
def tok(tiny_checkpoint):
    from triton_qwen3_tts.model.text import load_text_tokenizer

    return load_text_tokenizer(tiny_checkpoint)


def test_bound_is_the_layout_of_the_longest_strings():
    c = CFG["tiny"]  # CustomVoice, keeps instructions; non-streaming: text in the prompt
    assert max_prompt_rows(c, 10, 5) == (3 + 4 + 1 + 1) + (4 * 5 + 8) + (4 * 10 + 2)
    assert max_prompt_rows(CFG["0.6b-customvoice"], 10, 5) == 9 + 42  # 0.6B drops the instruction
    assert max_prompt_rows(CFG["tiny-voicedesign"], 10, 5) == 8 + 28 + 42  # no speaker slot
    # Base streams the text (trailing rows): only the reference frames are prompt rows
    assert max_prompt_rows(CFG["tiny-base"], 2000, 1000, 2000, 376) == 9 + 1 + 376
    assert max_prompt_rows(CFG["tiny-base"], 10, 0, 10, 5, non_streaming=True) == 9 + 4 * 20 + 1 + 1 + 5
    with pytest.raises(ValueError):
        max_prompt_rows(CFG["tiny"], -1)


@pytest.mark.parametrize("preset", ["tiny", "tiny-voicedesign", "1.7b-customvoice", "0.6b-customvoice"])
def test_dense_strings_never_exceed_the_bound(tok, preset):
    """The real Qwen2 tokenizer on the densest strings: at most MAX_TOKENS_PER_CHAR ids a
    character, and a prompt never longer than max_prompt_rows for its string lengths."""
    c = CFG[preset]
    spk = "aiden" if c.task_type == "CustomVoice" else None
    for text in DENSE:
        ins = text[: len(text) // 2] if preset != "0.6b-customvoice" else None
        if c.task_type == "VoiceDesign" and not (ins or "").strip():
            ins = "calm"
        if not text.strip():
            continue
        ids = tok(text)["input_ids"]
        assert len(ids) <= MAX_TOKENS_PER_CHAR * len(text)
        for lang in ("auto", "english"):
            layout = build_prompt(
                c, tok, PromptRequest(task_type=c.task_type, text=text, language=lang, speaker=spk, instruct=ins)
            )
            assert layout.len <= max_prompt_rows(c, len(text), len(ins or "")), (preset, text, lang)


def test_the_bound_is_reached(tok):
    """4 ids per character is not slack: some characters take 4 (no merge covers their bytes)."""
    for text in WORST:
        assert len(tok(text)["input_ids"]) == MAX_TOKENS_PER_CHAR * len(text)


def test_base_icl_bound(tok):
    c = CFG["tiny-base"]
    R = 7
    for nsm in (False, True):
        for text in DENSE[:4]:
            layout = build_prompt(
                c,
                tok,
                PromptRequest(
                    task_type="Base",
                    text=text,
                    ref_text=text[:9],
                    ref_codes=np.zeros((R, 16), np.int64),
                    non_streaming_mode=nsm,
                ),
            )
            assert layout.len <= max_prompt_rows(c, len(text), 0, 9, R, non_streaming=nsm)


def test_max_ref_frames_covers_the_longest_reference():
    assert max_ref_frames(30.0) == 376  # ceil(30 s * 24000 / 1920) + 1 for resampling


@pytest.fixture()
def ckpt(tmp_path):
    def make(preset="tiny"):
        d = tmp_path / f"ckpt-{preset}"
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(presets.main_config(preset)))
        return str(d)

    return make


def params(pbtxt: str) -> dict:
    return dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', pbtxt))


def test_default_context_serves_every_readme_value(ckpt):
    """The README's defaults (max_frames_limit 4096, max_text_chars 2000, max_instruct_chars
    1000) on the real checkpoints' configs: max_model_len holds the longest prompt plus 4096
    frames, within max_position_embeddings."""
    for preset, rows in (
        ("1.7b-customvoice", 12019),
        ("0.6b-customvoice", 8011),
        ("1.7b-base", 386),
        ("1.7b-voicedesign", 12018),
    ):
        s = RepositorySettings(checkpoint=ckpt(preset), codec_backend="python")
        ctx = talker_context(s, Qwen3TTSConfig.from_dict(presets.main_config(preset)))
        assert (ctx.max_prompt_rows, ctx.required, ctx.max_model_len) == (rows, 4096 + rows + 1, 4096 + rows + 1)
        assert not ctx.warning


def test_build_writes_the_sized_context_and_the_limits(ckpt, tmp_path):
    s = RepositorySettings(
        checkpoint=ckpt(),
        codec_backend="python",
        device="cpu",
        max_frames_limit=400,
        default_max_frames=40,
        max_text_chars=500,
        max_instruct_chars=200,
    )
    out = build_repository(s, str(tmp_path / "repo"))
    talker = TalkerModelConfig.from_parameters(params(open(f"{out}/talker/config.pbtxt").read()))
    tts = TtsModelConfig.from_parameters(params(open(f"{out}/tts/config.pbtxt").read()))
    need = 400 + max_prompt_rows(CFG["tiny"], 500, 200) + 1
    assert talker.max_model_len == need <= 4096
    lim = tts.limits("CustomVoice")
    assert (lim.max_frames_limit, lim.max_text_chars, lim.max_instruct_chars) == (400, 500, 200)
    ctx = json.load(open(f"{out}/build.json"))["talker_context"]
    assert ctx["max_model_len"] == ctx["required"] == need and ctx["warning"] == ""


def test_explicit_max_model_len_too_small_fails_naming_the_flags(ckpt, tmp_path):
    s = RepositorySettings(
        checkpoint=ckpt(),
        codec_backend="python",
        device="cpu",
        max_model_len=1024,
        max_frames_limit=1000,
        default_max_frames=200,
    )
    with pytest.raises(RepositoryError) as e:
        build_repository(s, str(tmp_path / "repo"))
    msg = str(e.value)
    need = 1000 + max_prompt_rows(CFG["tiny"], 2000, 1000) + 1
    for flag in ("--max-model-len 1024", "--max-frames-limit", "--max-text-chars", str(need)):
        assert flag in msg, msg
    # large enough: taken as given
    s.max_model_len = need + 10
    s.max_text_chars, s.max_instruct_chars = 2000, 1000
    out = build_repository(RepositorySettings(**{**s.__dict__, "engine": "native"}), str(tmp_path / "repo"))
    assert (
        TalkerModelConfig.from_parameters(params(open(f"{out}/talker/config.pbtxt").read())).max_model_len == need + 10
    )
    with pytest.raises(RepositoryError, match="max_model_len 40000 is more than 32768"):
        build_repository(RepositorySettings(**{**s.__dict__, "max_model_len": 40000}), str(tmp_path / "repo"))


def test_cli_reports_the_context_and_warns_beyond_max_position_embeddings(ckpt, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "build_model_repository.py"),
            "--checkpoint",
            ckpt(),
            "--out",
            str(tmp_path / "repo"),
            "--codec-backend",
            "python",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "talker max_model_len 16116" in r.stdout
    assert "max_position_embeddings 4096" in r.stderr and "--max-text-chars" in r.stderr  # tiny: 4096 positions
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "build_model_repository.py"),
            "--checkpoint",
            ckpt(),
            "--out",
            str(tmp_path / "repo"),
            "--codec-backend",
            "python",
            "--device",
            "cpu",
            "--max-model-len",
            "1024",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--max-model-len 1024 is too small" in r.stderr
