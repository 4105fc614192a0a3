#!/usr/bin/env python3
"""Write a ready Triton model repository for a checkpoint.

  python scripts/build_model_repository.py --checkpoint DIR --out build/model_repository \
      [--codec-backend tensorrt|python] [--device gpu|cpu] [--engine vllm|native] [--plan model.plan] ...

Every setting of qwen3_tts_triton.serving.repository.RepositorySettings is a flag (underscores
become dashes); `--help` lists them with their defaults. Fails if any template placeholder is left
unfilled.
"""

import argparse
import dataclasses
import sys

from qwen3_tts_triton.serving.repository import RepositoryError, RepositorySettings, build_repository


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    for f in dataclasses.fields(RepositorySettings):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=f.default,
                           metavar="true|false", help=f"(default {f.default})")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
