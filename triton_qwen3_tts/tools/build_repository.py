"""Write a ready Triton model repository for a checkpoint (``qwen3-tts-build-repository``).

    qwen3-tts-build-repository --checkpoint DIR --out build/repo        # device and codec picked for this machine
    qwen3-tts-build-repository --checkpoint DIR --out build/repo --device gpu --codec-backend tensorrt --plan codec.plan

Every setting of triton_qwen3_tts/serving/settings.py is a flag (underscores become dashes);
`--help` lists them with their help, defaults and allowed values. `--device` (default
auto: gpu when a CUDA GPU is visible, else cpu) and `--codec-backend` (default auto: tensorrt on a
GPU with a plan, else python) say what they picked. On CPU the vLLM talker's KV cache is sized to
the model and context unless `--kv-cache-memory-bytes` is given. Fails if any template placeholder
is left unfilled. `scripts/build_model_repository.py` runs the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository, resolve_auto
from triton_qwen3_tts.serving.settings import SETTINGS

MODEL_EXTRA = ("torch", "transformers", "safetensors")


def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes"):
        return True
    if v in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qwen3-tts-build-repository",
        description="Write a ready Triton model repository for a Qwen3-TTS checkpoint.",
        epilog="Then serve it: qwen3-tts-serve --model-repository OUT",
    )
    p.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    for x in SETTINGS:  # serving/settings.py: each setting's flag, default, allowed values and help
        shown = "''" if x.default == "" else str(x.default).lower() if isinstance(x.default, bool) else x.default
        help_text = f"{x.help} (allowed: {x.allowed()}; default {shown})"
        if x.name == "checkpoint":
            p.add_argument(x.flag, required=True, help=x.help)
        elif x.choices:
            p.add_argument(
                x.flag,
                choices=x.choices,
                default=x.default,
                metavar="|".join(map(str, x.choices)) or "''",
                help=help_text,
            )
        elif x.type is bool:
            p.add_argument(x.flag, type=_bool, default=x.default, metavar="true|false", help=help_text)
        else:
            p.add_argument(x.flag, type=x.type, default=x.default, help=help_text)
    return p


def _missing_extra(e: ModuleNotFoundError) -> Optional[str]:
    name = (e.name or "").split(".")[0]
    return name if name in MODEL_EXTRA else None


def main(argv=None) -> int:
    a = vars(parser().parse_args(argv))
    out = a.pop("out")
    s = RepositorySettings(**a)
    for line in resolve_auto(s):
        print(line)
    try:
        path = build_repository(s, out)
    except RepositoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        if not _missing_extra(e):
            raise
        print(
            f"error: building this repository needs {e.name}, part of the [model] extra (e.g. the stateful "
            f"codec's state layout comes from the reference model): pip install 'triton-qwen3-tts[model]'",
            file=sys.stderr,
        )
        return 2
    print(f"model repository written to {path}")
    with open(os.path.join(path, "build.json")) as f:
        ctx = json.load(f)["talker_context"]
    print(
        f"talker max_model_len {ctx['max_model_len']}: max_frames_limit {s.max_frames_limit} frames after a "
        f"prompt of up to {ctx['max_prompt_rows']} rows (max_text_chars {s.max_text_chars}, max_instruct_chars "
        f"{s.max_instruct_chars}, at most 4 tokens per character) + 1"
    )
    if ctx.get("warning"):
        print(f"warning: {ctx['warning']}", file=sys.stderr)
    if s.engine == "native":
        print(
            f"native engine KV cache: {ctx['native_kv_cache_bytes'] / 2**30:.1f} GiB "
            f"({s.max_num_seqs} + 1 slots x {ctx['max_model_len']} positions)"
        )
    else:
        from triton_qwen3_tts.engines.vllm.engine import cache_root

        kv = ctx.get("kv_cache_memory_bytes") or 0
        if kv:
            print(f"talker KV cache (vLLM): {kv / 2**20:.0f} MiB ({ctx.get('kv_cache_memory_why', '')})")
        else:
            print(f"talker KV cache (vLLM): --gpu-memory-utilization {s.gpu_memory_utilization} of the GPU")
        print(
            f"cache: when the server starts, the talker writes vLLM's model folder under {cache_root() / 'vllm'} "
            "(QWEN3_TTS_CACHE or qwen3-tts-serve --cache-dir moves it)"
        )
    print(f"serve it: qwen3-tts-serve --model-repository {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
