"""Talker prompt (prefill) layout for every task type, and its embedding.

The talker's prompt is a sequence of *summed embeddings*, not token ids. Each row is the sum of
up to four components:

* a text vector ``T(id)`` (text embedding -> projection),
* a codec vector ``C(id)`` (talker codec embedding: tags, pad/bos, CustomVoice speakers),
* a reference frame ``F(ref_codes[k])`` (ICL: summed 16-codebook embedding),
* the continuous speaker x-vector (Base models, one row).

:func:`build_prompt` produces a :class:`PromptLayout` that says, with plain integer arrays, which
components every row has. It is pure (numpy only), so the serving front end can build, check and
size prompts without torch; the engine (or the reference generator) turns a layout into vectors
with :func:`embed_prompt`, which imports torch lazily.

Order of rows (as the official ``generate()`` builds them):

0. instruction block (optional): ``T(id)`` for each id of ``<|im_start|>user\\n{instruct}<|im_end|>\\n``
1. role: ``T(151644) T(77091) T(198)``
2. codec tag block ``K``: language tags (3 for "auto", 4 otherwise, dialect rule applied), the
   optional speaker slot, then ``codec_pad``; every element carries ``T(tts_pad)`` except the last
   one (the codec_pad slot), which carries ``T(tts_bos)``.
3. tail by mode: streaming / non-streaming, with or without ICL reference.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from triton_qwen3_tts.model.config import MODEL_TYPE_TO_TASK, Qwen3TTSConfig
from triton_qwen3_tts.model import text as text_mod

__all__ = [
    "TASK_TYPES",
    "PromptError",
    "PromptRequest",
    "PromptLayout",
    "validate_request",
    "build_prompt",
    "build_layout",
    "embed_prompt",
    "default_non_streaming",
    "max_prompt_rows",
    "MAX_TOKENS_PER_CHAR",
]

TASK_TYPES: Tuple[str, ...] = tuple(MODEL_TYPE_TO_TASK.values())  # CustomVoice, VoiceDesign, Base

# Official wrapper defaults for non_streaming_mode: generate_custom_voice and
# generate_voice_design put the whole text in the prefill; generate_voice_clone streams it.
_DEFAULT_NON_STREAMING = {"CustomVoice": True, "VoiceDesign": True, "Base": False}


def default_non_streaming(task_type: str) -> bool:
    """The official wrapper's ``non_streaming_mode`` default for ``task_type``."""
    return _DEFAULT_NON_STREAMING[task_type]


class PromptError(ValueError):
    """A prompt request is invalid for this checkpoint. ``field`` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class PromptRequest:
    """What the prompt depends on; one synthesis request.

    ``ref_codes`` are the speech-tokenizer codes of the reference audio, ``[R, 16]`` (ICL only).
    ``non_streaming_mode=None`` means the official wrapper's default for the task type
    (CustomVoice / VoiceDesign: True, Base: False). ``x_vector_only`` (Base) clones from the
    speaker x-vector alone; ``ref_text`` and ``ref_codes`` are then ignored, as officially.
    """

    task_type: str
    text: str
    language: Optional[str] = "auto"
    speaker: Optional[str] = None
    instruct: Optional[str] = None
    ref_text: Optional[str] = None
    ref_codes: Optional[np.ndarray] = None
    x_vector_only: bool = False
    non_streaming_mode: Optional[bool] = None


@dataclass(frozen=True)
class PromptLayout:
    """Per-row components of a talker prompt (all arrays int64, ``-1`` = component absent).

    * ``text_ids[L]``: text token whose ``T(id)`` is added to the row.
    * ``codec_ids[L]``: codec id whose ``C(id)`` is added (tags, pad, bos, CustomVoice speaker).
    * ``ref_frame[L]``: index into ``ref_codes`` whose ``F(frame)`` is added (ICL).
    * ``speaker_row``: row that receives the continuous x-vector (Base), or -1. CustomVoice
      speakers are *not* here: they are ``C(spk_id)`` in ``codec_ids``.
    * ``trailing_text_ids[N]``: text ids added to decode inputs 0..N-1; ``T(tts_pad_id)`` after.
    * ``ref_codes``: ``[R, G]`` reference codes (ICL) or None.
    """

    text_ids: np.ndarray
    codec_ids: np.ndarray
    ref_frame: np.ndarray
    speaker_row: int
    trailing_text_ids: np.ndarray
    ref_codes: Optional[np.ndarray]
    tts_pad_id: int
    language_id: Optional[int]  # codec language tag used (dialect applied), None for "auto"
    non_streaming: bool
    icl: bool

    @property
    def len(self) -> int:
        """Prompt length L (number of prefill rows)."""
        return int(self.text_ids.shape[0])

    def __len__(self) -> int:
        return self.len

    @property
    def num_trailing(self) -> int:
        return int(self.trailing_text_ids.shape[0])


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _opt_str(field: str, v: Any) -> Optional[str]:
    if v is None:
        return None
    if not isinstance(v, str):
        raise PromptError(field, f"must be a string, got {type(v).__name__}")
    return v


def _allowed(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "(none)"


def _check_ref_codes(config: Qwen3TTSConfig, codes: Any) -> np.ndarray:
    groups = config.talker.num_code_groups
    size = config.talker.codebook_size
    try:
        a = np.asarray(codes)
    except Exception as e:  # pragma: no cover - numpy accepts nearly anything
        raise PromptError("ref_codes", f"not an array ({e})") from None
    if a.ndim != 2 or a.shape[1] != groups or a.shape[0] < 1:
        raise PromptError("ref_codes", f"expected shape [R, {groups}] with R >= 1, got {list(a.shape)}")
    if not np.issubdtype(a.dtype, np.integer):
        raise PromptError("ref_codes", f"expected integer codes, got dtype {a.dtype}")
    if a.min() < 0 or a.max() >= size:
        raise PromptError("ref_codes", f"codes must lie in [0, {size}), got [{int(a.min())}, {int(a.max())}]")
    return a.astype(np.int64, copy=True)


def validate_request(config: Qwen3TTSConfig, req: PromptRequest) -> PromptRequest:
    """Check ``req`` against the checkpoint and return it normalised.

    Normalisation: task type canonical spelling; language and speaker stripped and lower-cased
    (None/"" language -> "auto", None/"" speaker -> None); empty instruction -> None;
    ``non_streaming_mode`` resolved to the task default; unused fields dropped (instruction on
    0.6B CustomVoice, ref_text/ref_codes in x-vector-only mode), as the official wrapper does.

    Differences from the official wrapper, on purpose: it accepts a VoiceDesign request without
    an instruction, and silently ignores fields a task does not use; we reject both, because a
    client sending them almost certainly made a mistake.
    """
    if not isinstance(req, PromptRequest):
        raise TypeError(f"expected PromptRequest, got {type(req).__name__}")

    # task_type
    tt = _opt_str("task_type", req.task_type)
    canon = {t.lower(): t for t in TASK_TYPES}
    task = canon.get((tt or "").strip().lower())
    if task is None:
        raise PromptError("task_type", f"unknown task type {req.task_type!r}; allowed: {_allowed(TASK_TYPES)}")
    if task != config.task_type:
        raise PromptError(
            "task_type",
            f"{task} is not served by this checkpoint "
            f"(tts_model_type={config.tts_model_type}); allowed: {config.task_type}",
        )

    # text
    text = _opt_str("text", req.text)
    if text is None or not text.strip():
        raise PromptError("text", "must be a non-empty string")

    # language
    lang = (_opt_str("language", req.language) or "").strip().lower() or "auto"
    supported = config.supported_languages
    if lang not in supported:
        if lang in config.talker.codec_language_id:  # a dialect tag
            users = sorted(s for s, d in config.talker.spk_is_dialect.items() if d == lang)
            raise PromptError(
                "language",
                f"dialect {lang!r} cannot be selected directly; it is used "
                f"automatically for speaker(s) {_allowed(users)} with language "
                f"chinese or auto; allowed: {_allowed(supported)}",
            )
        raise PromptError("language", f"unsupported language {req.language!r}; allowed: {_allowed(supported)}")

    # speaker
    spk = (_opt_str("speaker", req.speaker) or "").strip().lower() or None
    if task == "CustomVoice":
        # The official wrapper lets a CustomVoice request have no speaker (no speaker slot).
        if spk is not None and spk not in config.talker.spk_id:
            raise PromptError("speaker", f"unknown speaker {req.speaker!r}; allowed: {_allowed(config.speakers)}")
    elif spk is not None:
        raise PromptError("speaker", f"is only used with task_type CustomVoice, not {task}")

    # instruct
    ins = _opt_str("instruct", req.instruct)
    if ins is not None and not ins.strip():
        ins = None  # official: empty instruction == no instruction
    if task == "VoiceDesign" and ins is None:
        raise PromptError("instruct", "is required for task_type VoiceDesign (describe the voice)")
    if task == "Base" and ins is not None:
        raise PromptError("instruct", "is not supported by task_type Base (voice cloning)")
    if task == "CustomVoice" and config.tts_model_size == "0b6":
        ins = None  # the official 0.6B CustomVoice wrapper drops instructions

    # reference (Base)
    ref_text = _opt_str("ref_text", req.ref_text)
    if ref_text is not None and not ref_text.strip():
        ref_text = None
    ref_codes = req.ref_codes
    if not isinstance(req.x_vector_only, (bool, np.bool_)):
        raise PromptError("x_vector_only", f"must be a bool, got {type(req.x_vector_only).__name__}")
    xvec = bool(req.x_vector_only)
    if task != "Base":
        for name, val in (("ref_text", ref_text), ("ref_codes", ref_codes), ("x_vector_only", xvec or None)):
            if val is not None:
                raise PromptError(name, f"is only used with task_type Base, not {task}")
    elif xvec:
        ref_text, ref_codes = None, None  # official: x-vector-only ignores them
    else:
        if ref_codes is None:
            raise PromptError(
                "ref_codes",
                "are required for in-context cloning (Base); set "
                "x_vector_only=True to clone from the speaker x-vector alone",
            )
        if ref_text is None:
            raise PromptError(
                "ref_text",
                "is required for in-context cloning (Base); set "
                "x_vector_only=True to clone from the speaker x-vector alone",
            )
        ref_codes = _check_ref_codes(config, ref_codes)

    # mode
    nsm = req.non_streaming_mode
    if nsm is None:
        nsm = _DEFAULT_NON_STREAMING[task]
    elif not isinstance(nsm, (bool, np.bool_)):
        raise PromptError("non_streaming_mode", f"must be a bool or None, got {type(nsm).__name__}")

    return dataclasses.replace(
        req,
        task_type=task,
        text=text,
        language=lang,
        speaker=spk,
        instruct=ins,
        ref_text=ref_text,
        ref_codes=ref_codes,
        x_vector_only=xvec,
        non_streaming_mode=bool(nsm),
    )


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


def _language_tag(config: Qwen3TTSConfig, req: PromptRequest) -> Optional[int]:
    """Codec language id for the tag block, or None for "auto" (3-tag form).

    Dialect rule (official generate()): a dialect speaker with language chinese or auto uses the
    dialect's id in the 4-tag form, even when the language is "auto".
    """
    t = config.talker
    lang_id = None if req.language == "auto" else t.codec_language_id[req.language]
    if req.speaker is not None and req.language in ("chinese", "auto"):
        dialect = t.spk_is_dialect.get(req.speaker)
        if dialect:
            lang_id = t.codec_language_id[dialect]
    return lang_id


def build_layout(
    config: Qwen3TTSConfig,
    req: PromptRequest,
    text_ids: Sequence[int],
    instruct_ids: Optional[Sequence[int]] = None,
    ref_ids: Optional[Sequence[int]] = None,
) -> PromptLayout:
    """Build the layout from already tokenized strings (pure; ``req`` must be validated).

    ``text_ids`` is the whole :func:`text.assistant_text_ids` list, ``instruct_ids`` the whole
    instruction list (or None), ``ref_ids`` the whole :func:`text.ref_text_ids` list (ICL only).
    """
    t = config.talker
    pad_t, bos_t, eos_t = config.tts_pad_token_id, config.tts_bos_token_id, config.tts_eos_token_id
    role = [config.im_start_token_id, config.assistant_token_id, text_mod.NEWLINE_ID]
    ids = [int(i) for i in text_ids]
    if len(ids) < 9 or ids[:3] != role or ids[-5:] != [config.im_end_token_id, text_mod.NEWLINE_ID] + role:
        raise PromptError(
            "text",
            "tokenized target text does not follow the template "
            "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n",
        )
    body = ids[3:-5]
    if not body:
        raise PromptError("text", "tokenizes to no tokens")

    rows_t: List[int] = []
    rows_c: List[int] = []
    rows_f: List[int] = []

    def add(tid: int = -1, cid: int = -1, frame: int = -1) -> None:
        rows_t.append(int(tid))
        rows_c.append(int(cid))
        rows_f.append(int(frame))

    # 0. instruction block
    if req.instruct is not None:
        if not instruct_ids:
            raise PromptError("instruct", "instruction ids are missing")
        for i in instruct_ids:
            add(tid=i)
    # 1. role
    for i in ids[:3]:
        add(tid=i)
    # 2. codec tag block
    lang_id = _language_tag(config, req)
    if lang_id is None:
        tags = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    else:
        tags = [t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id]
    for c in tags:
        add(tid=pad_t, cid=c)
    speaker_row = -1
    if req.task_type == "CustomVoice" and req.speaker is not None:
        add(tid=pad_t, cid=t.spk_id[req.speaker])
    elif req.task_type == "Base":
        # The x-vector slot exists in both ICL and x-vector-only mode.
        speaker_row = len(rows_t)
        add(tid=pad_t)
    add(tid=bos_t, cid=t.codec_pad_id)

    # 3. tail
    nsm = bool(req.non_streaming_mode)
    icl = req.task_type == "Base" and not req.x_vector_only
    ref_codes = None
    trailing: List[int] = []
    if icl:
        ref_codes = np.asarray(req.ref_codes, dtype=np.int64)
        if ref_ids is None:
            raise PromptError("ref_text", "reference text ids are missing")
        rids = [int(i) for i in ref_ids]
        if len(rids) < 5 or rids[:3] != role or rids[-2:] != [config.im_end_token_id, text_mod.NEWLINE_ID]:
            raise PromptError(
                "ref_text",
                "tokenized reference text does not follow the template <|im_start|>assistant\\n{ref_text}<|im_end|>\\n",
            )
        y = rids[3:-2] + body + [eos_t]
        n_z = 1 + ref_codes.shape[0]  # Z = [C(bos), F(ref_1) .. F(ref_R)]
        if nsm:
            for tid in y:
                add(tid=tid, cid=t.codec_pad_id)
            add(tid=pad_t, cid=t.codec_bos_id)
            for k in range(ref_codes.shape[0]):
                add(tid=pad_t, frame=k)
        else:
            if len(y) > n_z:
                trailing = y[n_z:]
                y = y[:n_z]
            else:
                y = y + [pad_t] * (n_z - len(y))
            add(tid=y[0], cid=t.codec_bos_id)
            for k in range(ref_codes.shape[0]):
                add(tid=y[k + 1], frame=k)
    elif nsm:
        for tid in body + [eos_t]:
            add(tid=tid, cid=t.codec_pad_id)
        add(tid=pad_t, cid=t.codec_bos_id)
    else:
        add(tid=body[0], cid=t.codec_bos_id)
        trailing = body[1:] + [eos_t]

    return PromptLayout(
        text_ids=np.asarray(rows_t, dtype=np.int64),
        codec_ids=np.asarray(rows_c, dtype=np.int64),
        ref_frame=np.asarray(rows_f, dtype=np.int64),
        speaker_row=speaker_row,
        trailing_text_ids=np.asarray(trailing, dtype=np.int64),
        ref_codes=ref_codes,
        tts_pad_id=pad_t,
        language_id=lang_id,
        non_streaming=nsm,
        icl=icl,
    )


# --------------------------------------------------------------------------------------------
# Size bound (serving: the talker's context must hold the longest prompt a request can make)
# --------------------------------------------------------------------------------------------

# The Qwen2 tokenizer is byte-level BPE: every token stands for at least one UTF-8 byte of the
# string it was cut from (an added token such as <|im_end|> for ten or more), and a character
# (code point) is at most 4 UTF-8 bytes. So a string of n characters tokenizes to at most 4n ids,
# whatever the text (emoji and CJK extension characters come close; English is ~0.25 ids per
# character). This is the bound the serving limits are sized with: it holds for any tokenizer
# that emits at least one byte per token, not just for the texts we tried.
MAX_TOKENS_PER_CHAR = 4


def max_prompt_rows(
    config: Qwen3TTSConfig,
    max_text_chars: int,
    max_instruct_chars: int = 0,
    max_ref_text_chars: int = 0,
    max_ref_frames: int = 0,
    non_streaming: Optional[bool] = None,
) -> int:
    """The most prompt rows (talker positions before the first frame) :func:`build_layout` can
    produce for a request of this checkpoint's task type whose strings are at most these lengths
    in characters (``len(str)``), with at most ``max_ref_frames`` reference frames (ICL).

    Row by row, as :func:`build_layout` builds them (``T`` = :data:`MAX_TOKENS_PER_CHAR`):

    * instruction block (VoiceDesign; CustomVoice except 0.6B, which drops it): the ids of
      ``<|im_start|>user\\n{instruct}<|im_end|>\\n``: 2 added tokens + at most one id per byte of
      ``user\\n``, of the instruction and of ``\\n``: ``T * instruct + 8``;
    * role 3, codec tags 4 (a language or dialect tag; "auto" has 3), the speaker slot
      (CustomVoice speaker / Base x-vector) 1, the ``codec_pad`` + ``tts_bos`` row 1;
    * tail, non-streaming: the text body (``ids[3:-5]`` decode to exactly the text: at most one
      id per byte, ``T * text``) + EOS row + ``codec_bos`` row; streaming: 1 row (the rest of the
      text rides on the decode steps as trailing rows, which take no position of their own);
    * ICL (Base with ``ref_text`` and reference codes): streaming ``1 + R`` rows, non-streaming
      the reference body, the text body and EOS (``T * (ref_text + text) + 1``) + ``1 + R``.

    ``non_streaming`` None is the task's default (the talker model always uses it).
    """
    for name, v in (
        ("max_text_chars", max_text_chars),
        ("max_instruct_chars", max_instruct_chars),
        ("max_ref_text_chars", max_ref_text_chars),
        ("max_ref_frames", max_ref_frames),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    task = config.task_type
    nsm = default_non_streaming(task) if non_streaming is None else bool(non_streaming)
    T = MAX_TOKENS_PER_CHAR
    text = T * max_text_chars
    rows = 3 + 4 + 1  # role, codec tags (4-tag form), codec_pad/tts_bos
    if task in ("CustomVoice", "Base"):
        rows += 1  # CustomVoice speaker slot / Base x-vector slot
    if task == "VoiceDesign" or (task == "CustomVoice" and config.tts_model_size != "0b6"):
        rows += T * max_instruct_chars + 8
    plain = text + 2 if nsm else 1  # no ICL reference
    if task != "Base":
        return rows + plain
    n_z = 1 + max_ref_frames
    icl = T * (max_ref_text_chars + max_text_chars) + 1 + n_z if nsm else n_z
    return rows + max(plain, icl)


def build_prompt(config: Qwen3TTSConfig, tokenizer, req: PromptRequest) -> PromptLayout:
    """Validate ``req``, tokenize its strings with ``tokenizer`` and build the layout.

    ``tokenizer`` is the checkpoint's text tokenizer (:func:`text.load_text_tokenizer`), or any
    object callable as ``tokenizer(str)["input_ids"]``. Each template string is tokenized whole,
    as the official wrapper does.
    """
    req = validate_request(config, req)
    text_ids = text_mod.assistant_text_ids(tokenizer, req.text)
    ins_ids = text_mod.instruct_ids(tokenizer, req.instruct) if req.instruct is not None else None
    ref_ids = None
    if req.task_type == "Base" and not req.x_vector_only:
        ref_ids = text_mod.ref_text_ids(tokenizer, req.ref_text)
    return build_layout(config, req, text_ids, ins_ids, ref_ids)


# --------------------------------------------------------------------------------------------
# Embedding (torch, imported lazily)
# --------------------------------------------------------------------------------------------


def embed_prompt(layout: PromptLayout, talker, speaker_vector=None):
    """Turn a layout into ``(prompt_embeds [L, D], trailing [N, D])``.

    ``talker`` provides ``embed_text(ids)``, ``embed_codec(ids)`` and ``embed_frame(codes[..., G])``
    (each ``-> [..., D]``). Each row is the sum of its present components; summation starts
    from zero and adds text, then codec, then the reference frame, then the x-vector, so rows with
    two components equal the official ``a + b`` bit for bit. ``speaker_vector`` ([D] or [1, D])
    is required exactly when the layout has a speaker row (Base models).
    """
    import torch

    L = layout.len
    try:
        device = next(talker.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")

    def ids_tensor(a: np.ndarray):
        return torch.as_tensor(np.ascontiguousarray(a), dtype=torch.long, device=device)

    if layout.speaker_row >= 0 and speaker_vector is None:
        raise ValueError("speaker_vector: required, the layout has a speaker (x-vector) row (Base model)")
    if layout.speaker_row < 0 and speaker_vector is not None:
        raise ValueError("speaker_vector: given, but the layout has no speaker (x-vector) row")

    parts = []  # (row index tensor, vectors)
    m = layout.text_ids >= 0
    if m.any():
        parts.append((np.nonzero(m)[0], talker.embed_text(ids_tensor(layout.text_ids[m]))))
    m = layout.codec_ids >= 0
    if m.any():
        parts.append((np.nonzero(m)[0], talker.embed_codec(ids_tensor(layout.codec_ids[m]))))
    m = layout.ref_frame >= 0
    if m.any():
        if layout.ref_codes is None:
            raise ValueError("layout: ref_frame rows present but ref_codes is None")
        parts.append((np.nonzero(m)[0], talker.embed_frame(ids_tensor(layout.ref_codes[layout.ref_frame[m]]))))
    trailing = None
    if layout.num_trailing:
        trailing = talker.embed_text(ids_tensor(layout.trailing_text_ids))
    if not parts:
        raise ValueError("layout: empty prompt")
    ref = parts[0][1]
    D, dtype = ref.shape[-1], ref.dtype
    out = torch.zeros(L, D, dtype=dtype, device=ref.device)
    for rows, vec in parts:
        idx = torch.as_tensor(rows, dtype=torch.long, device=ref.device)
        out[idx] = out[idx] + vec.to(dtype)
    if layout.speaker_row >= 0:
        sv = torch.as_tensor(speaker_vector).to(device=ref.device, dtype=dtype).reshape(-1)
        if sv.shape[0] != D:
            raise ValueError(f"speaker_vector: expected {D} values (talker hidden size), got {sv.shape[0]}")
        out[layout.speaker_row] = out[layout.speaker_row] + sv
    if trailing is None:
        trailing = torch.zeros(0, D, dtype=dtype, device=ref.device)
    return out, trailing.to(dtype)
