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
from keel.hf.resolve import DEFAULT_MODEL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    libs = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in keel._native.loaded_libraries().items()}
    t0 = time.perf_counter()
    llm = LLM(args.model)
    load_s = time.perf_counter() - t0
    # the question, plus a longer answer in the same batch so the token comparison has some length
    prompts = [args.prompt, "Give me three tips for writing clean Python code."]
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], SamplingParams(max_tokens=args.max_tokens))
    n = sum(len(o.token_ids) for o in outs)
    print(f"torch {torch.__version__} | model {args.model} | load {load_s:.1f}s | "
          f"generate {max(o.total_s for o in outs):.2f}s for {n} tokens (batch of {len(outs)})")
    for p, o in zip(prompts, outs, strict=True):
        print(f"user: {p}\nkeel: {o.text}")
    with open(args.out, "w") as f:
        json.dump({"torch": torch.__version__, "libraries": libs, "text": outs[0].text,
                   "token_ids": [o.token_ids for o in outs]}, f)


if __name__ == "__main__":
    main()
