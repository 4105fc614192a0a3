#!/usr/bin/env python3
"""Write a ready Triton model repository for a checkpoint.

  python scripts/build_model_repository.py --checkpoint DIR --out build/model_repository \
      [--codec-backend tensorrt|python] [--device gpu|cpu] [--engine vllm|native] [--plan model.plan] ...

Every setting of triton_qwen3_tts.serving.repository.RepositorySettings is a flag (underscores
become dashes); `--help` lists them with their defaults. Fails if any template placeholder is left
unfilled.
"""

import argparse
import dataclasses
import json
import sys

from triton_qwen3_tts.serving.repository import RepositoryError, RepositorySettings, build_repository


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    for f in dataclasses.fields(RepositorySettings):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(
                flag,
                type=lambda s: s.lower() in ("1", "true", "yes"),
                default=f.default,
                metavar="true|false",
                help=f"(default {f.default})",
            )
        elif f.default is dataclasses.MISSING:
            p.add_argument(flag, required=True)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default, help=f"(default {f.default!r})")
    a = vars(p.parse_args(argv))
    out = a.pop("out")
    try:
        path = build_repository(RepositorySettings(**a), out)
    except RepositoryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model repository written to {path}")
    with open(f"{path}/build.json") as f:
        ctx = json.load(f)["talker_context"]
    s = RepositorySettings(**a)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
