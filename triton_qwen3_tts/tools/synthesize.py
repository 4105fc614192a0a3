"""Offline synthesis with the plain-PyTorch reference model (no server).

    python -m triton_qwen3_tts.tools.synthesize --checkpoint DIR --text "Hello." --speaker vivian \
        --language english --out out.wav

CustomVoice uses ``--speaker``; VoiceDesign needs ``--instruct``; Base clones from ``--ref-audio``
(x-vector only with ``--x-vector-only``, in-context with ``--ref-text``). Generation shows a
progress bar (frames), then the whole utterance is decoded and written with soundfile.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Offline Qwen3-TTS synthesis with the reference model")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--out", default="out.wav")
    p.add_argument("--speaker")
    p.add_argument("--language", default="auto")
    p.add_argument("--instruct")
    p.add_argument("--ref-audio")
    p.add_argument("--ref-text")
    p.add_argument("--x-vector-only", action="store_true")
    p.add_argument("--max-frames", type=int, default=None, help="default: the checkpoint's max_new_tokens")
    p.add_argument("--greedy", action="store_true")
    # the official generation kwargs (default: the checkpoint's generation_config.json)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--subtalker-temperature", type=float)
    p.add_argument("--subtalker-top-k", type=int)
    p.add_argument("--subtalker-top-p", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args(argv)

    import soundfile as sf
    from tqdm import tqdm

    from triton_qwen3_tts.model.checkpoint import load_checkpoint
    from triton_qwen3_tts.model.generate import generate_codes
    from triton_qwen3_tts.model.prompt import PromptError, PromptRequest, build_prompt, embed_prompt
    from triton_qwen3_tts.model.sampling import SamplingParams

    t0 = time.time()
    ck = load_checkpoint(
        a.checkpoint,
        device=a.device,
        dtype=getattr(torch, a.dtype),
        load_encoder=bool(a.ref_audio and not a.x_vector_only),
    )
    talker = ck.model.talker
    speaker_vec, ref_codes = None, None
    if a.ref_audio:
        from triton_qwen3_tts.model.audio import prepare_reference_audio
        from triton_qwen3_tts.model.speaker_encoder import extract_speaker_embedding

        wav, sr = sf.read(a.ref_audio, dtype="float32", always_2d=True)
        wav24 = prepare_reference_audio(wav.mean(axis=1), sr, 1.0, 60.0)
        speaker_vec = extract_speaker_embedding(ck.model.speaker_encoder, wav24)
        if not a.x_vector_only:
            from triton_qwen3_tts.model.codec_encoder import encode_reference

            ref_codes = encode_reference(ck.encoder, wav24)
    try:
        layout = build_prompt(
            ck.config,
            ck.tokenizer,
            PromptRequest(
                task_type=ck.config.task_type,
                text=a.text,
                language=a.language,
                speaker=a.speaker,
                instruct=a.instruct,
                ref_text=a.ref_text,
                ref_codes=ref_codes,
                x_vector_only=a.x_vector_only and ck.config.task_type == "Base",
            ),
        )
    except PromptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with torch.no_grad():
        pe, tr = embed_prompt(layout, talker, speaker_vec)
        pad = talker.embed_text([ck.config.tts_pad_token_id])[0]
    names = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")
    names += ("subtalker_temperature", "subtalker_top_k", "subtalker_top_p")
    over = {k: getattr(a, k) for k in names if getattr(a, k) is not None}
    if a.greedy:
        over.update(do_sample=False, subtalker_dosample=False)
    if a.max_frames:
        over["max_new_tokens"] = a.max_frames + 1
    params = SamplingParams.from_defaults(ck.generation, **over)
    bar = tqdm(total=params.max_new_tokens - 1, unit="frame", desc="talker")
    codes = generate_codes(talker, pe, tr, pad, params, on_frame=lambda f: bar.update(1))
    bar.close()
    with torch.no_grad():
        dec = ck.decoder
        full = codes if ref_codes is None else torch.cat([torch.as_tensor(ref_codes), codes])
        audio = dec.decode(full[None].to(next(dec.parameters()).device))[0].float().cpu().numpy()
    if ref_codes is not None:  # the reference frames were only decoder context
        audio = audio[len(ref_codes) * dec.samples_per_frame :]
    sf.write(a.out, audio, 24000)
    print(f"wrote {a.out}: {codes.shape[0]} frames, {len(audio) / 24000:.2f} s of audio in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
