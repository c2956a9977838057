#!/usr/bin/env python
"""Greedy chat generation with keel for the demo: prints the answer and saves tokens as JSON.

  python scripts/demo_generate.py OUT.json [--model ID] [--prompt TEXT] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch

import keel
from keel import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    libs = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in keel._native.loaded_libraries().items()}
    t0 = time.perf_counter()
    llm = LLM(args.model)
    load_s = time.perf_counter() - t0
    out = llm.chat([{"role": "user", "content": args.prompt}], SamplingParams(max_tokens=args.max_tokens))[0]
    print(f"torch {torch.__version__} | model {args.model} ({llm.dtype if hasattr(llm, 'dtype') else ''}) "
          f"| load {load_s:.1f}s | generate {out.total_s:.2f}s for {len(out.token_ids)} tokens")
    print(f"user: {args.prompt}\nkeel: {out.text}")
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "libraries": libs, "text": out.text, "token_ids": out.token_ids}, f)


if __name__ == "__main__":
    main()
