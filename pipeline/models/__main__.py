"""``python -m pipeline.models prepare [name|all]``: build named models into the cache (idempotent)."""

from __future__ import annotations

import argparse
import sys
import time

from pipeline.models import CACHE_ENV, MODEL_NAMES, resolve_model

# What `make model` prepares; gemma3_270m (1.1 GB, the second architecture of the tests) too.
DEFAULT = ("smollm2_135m", "gemma3_270m", "tiny", "tiny_bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.models", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build models into the cache (idempotent)")
    prep.add_argument("which", nargs="?", default="all", choices=(*MODEL_NAMES, "all"))
    prep.add_argument("--cache-dir", default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/privy-rl)")
    args = parser.parse_args(argv)
    try:
        for name in DEFAULT if args.which == "all" else (args.which,):
            t0 = time.perf_counter()
            path = resolve_model(name, args.cache_dir)
            print(f"{name}: {path} ({time.perf_counter() - t0:.1f} s)", flush=True)
    except (RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
