"""Config dictionaries for the official checkpoint layouts and a tiny test preset.

These are *data*, written in the exact JSON shape of the official files, so that the random
checkpoints made from them exercise the real loading code. Real-size presets reproduce the
parameter counts of the released ``model.safetensors`` files (checked by tests on meta tensors:
tests/test_talker.py, tests/test_checkpoint.py).
"""

from __future__ import annotations

import copy

PRESETS = (
    "tiny",
    "tiny-base",
    "tiny-voicedesign",
    "0.6b-customvoice",
    "0.6b-base",
    "1.7b-customvoice",
    "1.7b-base",
    "1.7b-voicedesign",
)

# Official id values (``talker_config`` of the released config.json files).
LANGUAGES = {
    "english": 2050,
    "german": 2053,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
    "portuguese": 2071,
}
DIALECTS = {"sichuan_dialect": 2062, "beijing_dialect": 2074}
SPEAKERS = {
    "aiden": 2861,
    "sohee": 2864,
    "ono_anna": 2873,
    "eric": 2875,
    "dylan": 2878,
    "uncle_fu": 3010,
    "ryan": 3061,
    "vivian": 3065,
    "serena": 3066,
}
SPEAKER_DIALECT = {
    "eric": "sichuan_dialect",
    "dylan": "beijing_dialect",
    "aiden": False,
    "sohee": False,
    "ono_anna": False,
    "uncle_fu": False,
    "ryan": False,
    "vivian": False,
    "serena": False,
}

GENERATION_CONFIG = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": 8192,
}

_CODE_PREDICTOR = {
    "model_type": "qwen3_tts_talker_code_predictor",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "max_position_embeddings": 65536,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "vocab_size": 2048,
    "num_code_groups": 16,
    "use_sliding_window": False,
    "layer_types": ["full_attention"] * 5,
}

_TALKER = {
    "model_type": "qwen3_tts_talker",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
    "use_sliding_window": False,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "vocab_size": 3072,
    "text_vocab_size": 151936,
    "text_hidden_size": 2048,
    "num_code_groups": 16,
    "position_id_per_seconds": 13,
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
    "codec_language_id": dict(LANGUAGES),
    "spk_id": {},
    "spk_is_dialect": {},
    "code_predictor_config": _CODE_PREDICTOR,
}

_TOP = {
    "architectures": ["Qwen3TTSForConditionalGeneration"],
    "model_type": "qwen3_tts",
    "tokenizer_type": "qwen3_tts_tokenizer_12hz",
    "assistant_token_id": 77091,
    "im_start_token_id": 151644,
    "im_end_token_id": 151645,
    "tts_pad_token_id": 151671,
    "tts_bos_token_id": 151672,
    "tts_eos_token_id": 151673,
}

SPEECH_TOKENIZER_DECODER = {
    "codebook_size": 2048,
    "codebook_dim": 512,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "latent_dim": 1024,
    "max_position_embeddings": 8000,
    "rope_theta": 10000,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 64,
    "attention_bias": False,
    "sliding_window": 72,
    "hidden_act": "silu",
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-05,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "semantic_codebook_size": 4096,
    "vector_quantization_hidden_dimension": 512,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 1536,
    "attention_dropout": 0.0,
}

SPEECH_TOKENIZER_ENCODER = {  # MimiConfig kwargs of the speech tokenizer's encoder
    "sampling_rate": 24000,
    "frame_rate": 12.5,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": 2048,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "upsample_groups": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 250,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
    "use_cache": False,
    "dtype": "float32",
}

SPEECH_TOKENIZER_PREPROCESSOR = {
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}

# Tiny sizes: small widths, but head_dim >= 32 and codebooks of the real size (2048 codes) so
# that every id and code range is the real one. vLLM-CPU needs head_dim in its supported set.
_TINY_TALKER = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "text_hidden_size": 64,
    "max_position_embeddings": 4096,
}
_TINY_CP = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
}
_TINY_DECODER = {
    "codebook_dim": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "latent_dim": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "decoder_dim": 64,
    "vector_quantization_hidden_dimension": 32,
}
_TINY_ENCODER = {
    "hidden_size": 32,
    "num_filters": 4,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "upsample_groups": 32,
}
_TINY_SPEAKER_ENCODER = {
    "enc_channels": [32, 32, 32, 32, 96],
    "enc_attention_channels": 16,
    "enc_res2net_scale": 4,
    "enc_se_channels": 16,
}


def _parse(name: str):
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    if name.startswith("tiny"):
        kind = {"tiny": "custom_voice", "tiny-base": "base", "tiny-voicedesign": "voice_design"}[name]
        return "tiny", kind
    size, kind = name.split("-")
    kind = {"customvoice": "custom_voice", "base": "base", "voicedesign": "voice_design"}[kind]
    return size, kind


def main_config(name: str) -> dict:
    """The ``config.json`` dict for a preset."""
    size, kind = _parse(name)
    cfg = copy.deepcopy(_TOP)
    talker = copy.deepcopy(_TALKER)
    cfg["tts_model_size"] = "0b6" if size == "0.6b" else ("1b7" if size == "1.7b" else "tiny")
    cfg["tts_model_type"] = kind
    if size == "0.6b":
        talker.update({"hidden_size": 1024, "intermediate_size": 3072})
    elif size == "tiny":
        talker.update(_TINY_TALKER)
        talker["code_predictor_config"].update(_TINY_CP)
    if kind == "custom_voice":
        talker["codec_language_id"].update(DIALECTS)
        talker["spk_id"] = dict(SPEAKERS)
        talker["spk_is_dialect"] = dict(SPEAKER_DIALECT)
    if kind == "base":
        se = {"enc_dim": talker["hidden_size"], "sample_rate": 24000}
        if size == "tiny":
            se.update(_TINY_SPEAKER_ENCODER)
        cfg["speaker_encoder_config"] = se
    cfg["talker_config"] = talker
    return cfg


def speech_tokenizer_config(name: str) -> dict:
    size, _ = _parse(name)
    dec = copy.deepcopy(SPEECH_TOKENIZER_DECODER)
    enc = copy.deepcopy(SPEECH_TOKENIZER_ENCODER)
    if size == "tiny":
        dec.update(_TINY_DECODER)
        enc.update(_TINY_ENCODER)
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "encode_downsample_rate": 1920,
        "decode_upsample_rate": 1920,
        "encoder_config": enc,
        "decoder_config": dec,
        "transformers_version": "4.57.3",
    }
