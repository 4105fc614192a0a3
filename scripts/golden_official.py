#!/usr/bin/env python
"""Golden parity fixtures from the OFFICIAL Qwen3-TTS implementation (qwen-tts==0.1.1).

Runs INSIDE the golden venv (.venv-golden, made by scripts/make_golden.py). It must not import
our package (triton_qwen3_tts): the fixtures it writes are the yardstick our code is tested
against (tests/test_golden_parity.py). See docs/golden.md.

    python scripts/golden_official.py --checkpoints DIR --out tests/fixtures

``DIR`` holds ``tiny``, ``tiny-base`` and ``tiny-voicedesign`` random checkpoints written by
scripts/make_random_checkpoint.py (seed recorded in the manifest). Writes:

* ``golden.npz``     - all arrays (prompt embeddings, trailing queues, greedy codes, decoder
  waveform, reference waveform, speaker embedding, reference codes);
* ``golden.json``    - the manifest: versions, checkpoint presets + seeds, every call's inputs
  (texts, speakers, languages, instruct, ref text, modes, generation kwargs) and array keys.

How the official internals are captured (no official file is modified):

* ``Qwen3TTSForConditionalGeneration.generate`` (instance attribute ``wrapper.model.generate``)
  is wrapped to record its text-token inputs (input_ids / instruct_ids / ref_ids) and its
  returned ``talker_codes_list`` (the greedy codes; EOS and after already cut off);
* ``Qwen3TTSTalkerForConditionalGeneration.generate`` (``wrapper.model.talker.generate``) is
  wrapped to record the exact ``inputs_embeds`` (prefill), ``trailing_text_hidden`` and
  ``tts_pad_embed`` it receives.

The public wrapper methods (generate_custom_voice / generate_voice_design /
generate_voice_clone / create_voice_clone_prompt) are what get called, with
``do_sample=False, subtalker_dosample=False, max_new_tokens=MAX_NEW_TOKENS``.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import platform
import sys
import types
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")


def _stub_25hz_only_imports() -> list[str]:
    """Make torchaudio / sox importable as empty stubs.

    qwen_tts/core/__init__.py imports the 25 Hz tokenizer, whose speech_vq.py imports ``sox`` and
    ``torchaudio.compliance.kaldi`` at module import time. The 12 Hz code paths used here never
    call them. PyPI torchaudio is a CUDA build that does not import with the local CPU torch
    2.13, and sox needs the sox binary; so we insert empty modules. Any attribute use would
    raise AttributeError, i.e. a stub being *used* cannot go unnoticed.
    """
    stubbed = []
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "sox"):
        if name in sys.modules:
            continue
        try:
            __import__(name)
            continue
        except Exception:
            pass
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []  # package-like, so submodules resolve
        sys.modules[name] = m
        stubbed.append(name)
    if "torchaudio.compliance" in sys.modules and "torchaudio" in stubbed:
        sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
        sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
    return stubbed


STUBBED = _stub_25hz_only_imports()

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# --------------------------------------------------------------------------------------------
# Inputs (everything the test needs to reproduce the same calls goes into the manifest)
# --------------------------------------------------------------------------------------------

MAX_NEW_TOKENS = 24
ATTN_IMPLEMENTATION = "eager"
GREEDY = dict(do_sample=False, subtalker_dosample=False, max_new_tokens=MAX_NEW_TOKENS)

REF_WAV_SEED = 1234
REF_WAV_SECONDS = 2.0
SR = 24000
DECODE_CODES_SEED = 4321
DECODE_FRAMES = 40

EN_TEXT = "Hello world, this is a parity test."
EN_LONG = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the "
    "forest while the birds keep singing their long songs in the morning light."
)
ZH_TEXT = "你好，世界！今天天气很好。"
REF_TEXT = "This is the reference recording."

# (name, preset, method, kwargs); method is the official wrapper's method.
CASES = [
    ("cv_en_vivian_english", "tiny", "generate_custom_voice", dict(text=EN_TEXT, speaker="Vivian", language="English")),
    ("cv_zh_eric_auto_dialect", "tiny", "generate_custom_voice", dict(text=ZH_TEXT, speaker="eric", language="Auto")),
    (
        "cv_zh_dylan_chinese_dialect",
        "tiny",
        "generate_custom_voice",
        dict(text=ZH_TEXT, speaker="dylan", language="Chinese"),
    ),
    (
        "cv_en_ryan_auto_instruct",
        "tiny",
        "generate_custom_voice",
        dict(text=EN_TEXT, speaker="ryan", language="Auto", instruct="Speak slowly and calmly."),
    ),
    (
        "cv_en_aiden_english_streaming",
        "tiny",
        "generate_custom_voice",
        dict(text=EN_TEXT, speaker="aiden", language="English", non_streaming_mode=False),
    ),
    # Mixed-case words: the official processor is loaded with fix_mistral_regex=True, which under
    # transformers 4.57.3 swaps the pre-tokenizer regex ("HelloWorld" -> "Hello", "World").
    (
        "cv_en_serena_english_mixedcase",
        "tiny",
        "generate_custom_voice",
        dict(text="OpenAI's iPhone app says HelloWorld at 10:45.", speaker="serena", language="English"),
    ),
    (
        "vd_en_english",
        "tiny-voicedesign",
        "generate_voice_design",
        dict(text=EN_TEXT, instruct="A warm, deep male voice.", language="English"),
    ),
    (
        "vd_zh_auto",
        "tiny-voicedesign",
        "generate_voice_design",
        dict(text=ZH_TEXT, instruct="温柔的女声，语速稍慢。", language="Auto"),
    ),
    # (no instruct="" case: officially allowed, but our prompt.validate_request rejects a
    # VoiceDesign request without an instruction on purpose)
    (
        "vd_en_english_streaming",
        "tiny-voicedesign",
        "generate_voice_design",
        dict(text=EN_TEXT, instruct="Bright young female voice.", language="English", non_streaming_mode=False),
    ),
    (
        "base_xvec_en_english",
        "tiny-base",
        "generate_voice_clone",
        dict(text=EN_TEXT, language="English", x_vector_only_mode=True),
    ),
    (
        "base_xvec_zh_auto_nonstreaming",
        "tiny-base",
        "generate_voice_clone",
        dict(text=ZH_TEXT, language="Auto", x_vector_only_mode=True, non_streaming_mode=True),
    ),
    (
        "base_icl_en_english",
        "tiny-base",
        "generate_voice_clone",
        dict(text=EN_TEXT, language="English", ref_text=REF_TEXT, x_vector_only_mode=False),
    ),
    (
        "base_icl_long_english",
        "tiny-base",
        "generate_voice_clone",  # text longer than the ref codes
        dict(text=EN_LONG, language="English", ref_text=REF_TEXT, x_vector_only_mode=False),
    ),
    (
        "base_icl_en_nonstreaming",
        "tiny-base",
        "generate_voice_clone",
        dict(text=EN_TEXT, language="English", ref_text=REF_TEXT, x_vector_only_mode=False, non_streaming_mode=True),
    ),
]


def reference_waveform() -> np.ndarray:
    """2 s at 24 kHz: a 150 -> 3000 Hz linear chirp (amplitude 0.5) + N(0, 0.02) noise, seeded."""
    n = int(REF_WAV_SECONDS * SR)
    t = np.arange(n, dtype=np.float64) / SR
    f0, f1 = 150.0, 3000.0
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * REF_WAV_SECONDS))
    rng = np.random.default_rng(REF_WAV_SEED)
    wav = 0.5 * np.sin(phase) + 0.02 * rng.standard_normal(n)
    return wav.astype(np.float32)


def decode_codes() -> np.ndarray:
    rng = np.random.default_rng(DECODE_CODES_SEED)
    return rng.integers(0, 2048, size=(DECODE_FRAMES, 16), dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


class Recorder:
    def __init__(self, wrapper):
        self.last = {}
        model = wrapper.model
        orig_generate = model.generate
        orig_talker_generate = model.talker.generate

        def generate(*args, **kwargs):
            self.last["input_ids"] = [t[0].tolist() for t in kwargs["input_ids"]]
            for key in ("instruct_ids", "ref_ids"):
                v = kwargs.get(key)
                self.last[key] = None if v is None else [None if t is None else t[0].tolist() for t in v]
            codes_list, hidden_list = orig_generate(*args, **kwargs)
            self.last["codes"] = [c.detach().cpu().numpy().astype(np.int64) for c in codes_list]
            return codes_list, hidden_list

        def talker_generate(*args, **kwargs):
            self.last["inputs_embeds"] = kwargs["inputs_embeds"].detach().cpu().float().numpy()
            self.last["attention_mask"] = kwargs["attention_mask"].detach().cpu().numpy()
            self.last["trailing_text_hidden"] = kwargs["trailing_text_hidden"].detach().cpu().float().numpy()
            self.last["tts_pad_embed"] = kwargs["tts_pad_embed"].detach().cpu().float().numpy()
            self.last["talker_kwargs"] = {
                k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str)) or v is None
            }
            return orig_talker_generate(*args, **kwargs)

        model.generate = generate
        model.talker.generate = talker_generate

    def take(self):
        out, self.last = self.last, {}
        return out


def load(path: Path):
    from qwen_tts import Qwen3TTSModel

    w = Qwen3TTSModel.from_pretrained(
        str(path), dtype=torch.float32, device_map="cpu", attn_implementation=ATTN_IMPLEMENTATION
    )
    w.model.eval()
    _check_weights_loaded(w.model, path / "model.safetensors")
    _check_weights_loaded(w.model.speech_tokenizer.model, path / "speech_tokenizer" / "model.safetensors")
    return w


def _check_weights_loaded(module: torch.nn.Module, file: Path) -> None:
    """Every tensor of the module comes from the file, bit for bit (after the fp32 cast).

    Guards against from_pretrained silently keeping a randomly initialised parameter (a name
    mismatch between our random checkpoint and the official module would void the fixtures).
    """
    from safetensors import safe_open

    state = module.state_dict()
    with safe_open(str(file), framework="pt") as f:
        keys = set(f.keys())
        missing = sorted(k for k in state if k not in keys)
        unused = sorted(k for k in keys if k not in state)
        if missing or unused:
            raise RuntimeError(f"{file}: module keys not in file {missing[:10]}, file keys not used {unused[:10]}")
        for k in keys:
            if not torch.equal(f.get_tensor(k).to(state[k].dtype), state[k]):
                raise RuntimeError(f"{file}: {k} differs from the loaded parameter")


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in (
        "qwen-tts",
        "torch",
        "transformers",
        "accelerate",
        "numpy",
        "librosa",
        "soundfile",
        "onnxruntime",
        "einops",
        "safetensors",
        "huggingface_hub",
    ):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--checkpoints",
        type=Path,
        required=True,
        help="dir with tiny/, tiny-base/, tiny-voicedesign/ random checkpoints",
    )
    ap.add_argument(
        "--checkpoint-seed",
        type=int,
        required=True,
        help="seed the checkpoints were written with (recorded in the manifest)",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--extra-manifest",
        type=Path,
        default=None,
        help="json merged into the manifest's 'generator' entry (from make_golden.py)",
    )
    args = ap.parse_args(argv)

    import qwen_tts  # noqa: F401  (after the stubs)

    arrays: dict[str, np.ndarray] = {}
    manifest: dict = {
        "format": 1,
        "description": "Golden parity fixtures from the official qwen-tts 0.1.1 (see docs/golden.md)",
        "versions": versions(),
        "stubbed_modules": STUBBED,
        "attn_implementation": ATTN_IMPLEMENTATION,
        "dtype": "float32",
        "device": "cpu",
        "checkpoints": {
            p: {"preset": p, "seed": args.checkpoint_seed} for p in ("tiny", "tiny-base", "tiny-voicedesign")
        },
        "greedy": dict(GREEDY),
        "cases": [],
    }
    if args.extra_manifest:
        manifest["generator"] = json.loads(args.extra_manifest.read_text())

    wav = reference_waveform()
    arrays["ref_wav"] = wav
    manifest["ref_wav"] = {
        "key": "ref_wav",
        "sample_rate": SR,
        "seconds": REF_WAV_SECONDS,
        "seed": REF_WAV_SEED,
        "recipe": "0.5*sin(chirp 150->3000 Hz, linear) + 0.02*N(0,1) "
        "(numpy default_rng(seed).standard_normal), float32",
    }

    wrappers = {}

    def get(preset):
        if preset not in wrappers:
            wrappers[preset] = load(args.checkpoints / preset)
            wrappers[preset].recorder = Recorder(wrappers[preset])
        return wrappers[preset]

    # (c) decoder waveform of given codes (the CustomVoice checkpoint's speech tokenizer)
    cv = get("tiny")
    codes = decode_codes()
    wavs, sr = cv.model.speech_tokenizer.decode({"audio_codes": torch.from_numpy(codes)})
    arrays["decode_codes"] = codes.astype(np.int16)
    arrays["decode_wav"] = wavs[0].astype(np.float32)
    manifest["decode"] = {
        "checkpoint": "tiny",
        "codes_key": "decode_codes",
        "wav_key": "decode_wav",
        "frames": DECODE_FRAMES,
        "seed": DECODE_CODES_SEED,
        "sample_rate": sr,
        "recipe": "numpy default_rng(seed).integers(0, 2048, (frames, 16))",
        "call": "speech_tokenizer.decode({'audio_codes': codes[T,16]})",
    }
    print(f"decode: {codes.shape} -> {wavs[0].shape}", flush=True)

    # (d) speaker embedding and (e) reference codes of the reference waveform (Base checkpoint)
    base = get("tiny-base")
    items = base.create_voice_clone_prompt(ref_audio=(wav, SR), ref_text=REF_TEXT, x_vector_only_mode=False)
    spk = items[0].ref_spk_embedding.detach().cpu().float().numpy()
    ref_codes = items[0].ref_code.detach().cpu().numpy().astype(np.int64)
    direct_spk = base.model.extract_speaker_embedding(audio=wav, sr=SR).cpu().float().numpy()
    direct_codes = base.model.speech_tokenizer.encode(wav, sr=SR).audio_codes[0].cpu().numpy()
    assert np.array_equal(spk, direct_spk) and np.array_equal(ref_codes, direct_codes)
    arrays["speaker_embedding"] = spk
    arrays["ref_codes"] = ref_codes.astype(np.int16)
    manifest["speaker_embedding"] = {
        "checkpoint": "tiny-base",
        "wav_key": "ref_wav",
        "key": "speaker_embedding",
        "call": "model.extract_speaker_embedding(audio=ref_wav, sr=24000)",
    }
    manifest["ref_codes"] = {
        "checkpoint": "tiny-base",
        "wav_key": "ref_wav",
        "key": "ref_codes",
        "shape": list(ref_codes.shape),
        "call": "model.speech_tokenizer.encode(ref_wav, sr=24000).audio_codes[0]",
    }
    print(f"speaker embedding {spk.shape}, ref codes {ref_codes.shape}", flush=True)

    # (a) prompt embeddings + trailing queue and (b) greedy codes for every case
    for name, preset, method, kw in CASES:
        w = get(preset)
        call = dict(kw)
        if method == "generate_voice_clone":
            call["ref_audio"] = (wav, SR)
        torch.manual_seed(0)  # greedy: unused, but keep any stray draw deterministic
        getattr(w, method)(**call, **GREEDY)
        rec = w.recorder.take()
        assert rec["attention_mask"].all(), "batch of one: no padding expected"
        pk = f"{name}/"
        arrays[pk + "prompt_embeds"] = rec["inputs_embeds"][0]
        arrays[pk + "trailing"] = rec["trailing_text_hidden"][0]
        arrays[pk + "tts_pad_embed"] = rec["tts_pad_embed"].reshape(-1)
        arrays[pk + "codes"] = rec["codes"][0].astype(np.int16)
        entry = {
            "name": name,
            "checkpoint": preset,
            "method": method,
            "task_type": {
                "generate_custom_voice": "CustomVoice",
                "generate_voice_design": "VoiceDesign",
                "generate_voice_clone": "Base",
            }[method],
            "kwargs": kw,
            "non_streaming_mode": kw.get("non_streaming_mode", method != "generate_voice_clone"),
            "uses_ref_wav": method == "generate_voice_clone",
            "input_ids": rec["input_ids"][0],
            "instruct_ids": (rec["instruct_ids"] or [None])[0],
            "ref_ids": (rec["ref_ids"] or [None])[0],
            "talker_kwargs": rec["talker_kwargs"],
            "prompt_len": int(rec["inputs_embeds"].shape[1]),
            "trailing_len": int(rec["trailing_text_hidden"].shape[1]),
            "num_frames": int(rec["codes"][0].shape[0]),
            "keys": {k: pk + k for k in ("prompt_embeds", "trailing", "tts_pad_embed", "codes")},
        }
        manifest["cases"].append(entry)
        print(
            f"{name}: prompt {entry['prompt_len']}, trailing {entry['trailing_len']}, frames {entry['num_frames']}",
            flush=True,
        )

    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "golden.npz", **arrays)
    manifest["arrays"] = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in sorted(arrays.items())}
    (args.out / "golden.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    size = sum((args.out / f).stat().st_size for f in ("golden.npz", "golden.json"))
    print(f"wrote {args.out}/golden.npz + golden.json ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
