#!/usr/bin/env python
"""One pipeline probe: run keel's ops and a greedy generation, then report what native code ran.

  python scripts/demo_generate.py OUT.json [--model ID] [--prompt TEXT] [--max-tokens N] [--no-ops]

Run with the interpreter of an environment that has keel installed (never from the checkout's
root on sys.path). It prints the answer and writes OUT.json with the torch and Python versions,
the generated token ids, tokens/s and time to first token, and the sha256 of every keel library
mapped into THIS process, read from /proc/self/maps after the ops and the generation ran: that
is the code that really served the request, whatever files the wheel or the checkout hold.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import runpy
import time
from pathlib import Path

import torch

import keel
from keel import LLM, SamplingParams
from keel.hf.resolve import DEFAULT_MODEL

PROMPT = "What is the capital of France?"


def mapped_keel_libraries(package_dir: Path) -> dict[str, str]:
    """sha256 of each shared object under `package_dir` that this process has mapped, by relative path."""
    paths: set[Path] = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            path = Path(fields[5])
            if path.is_relative_to(package_dir) and ".so" in path.name:
                paths.add(path)
    return {p.relative_to(package_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-ops", action="store_true", help="skip the op-by-op comparison with plain torch")
    args = ap.parse_args()
    package_dir = Path(keel.__file__).resolve().parent
    if not args.no_ops:  # every op once against plain torch (scripts/demo_ops.py, same process)
        runpy.run_path(str(Path(__file__).with_name("demo_ops.py")), run_name="__main__")
    t0 = time.perf_counter()
    llm = LLM(args.model)
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)  # greedy, always max_tokens
    out = llm.chat([[{"role": "user", "content": args.prompt}]], params)[0]
    decode_s = out.total_s - out.ttft_s
    tok_s = (len(out.token_ids) - 1) / decode_s if decode_s > 0 else float("nan")
    libraries = mapped_keel_libraries(package_dir)
    print(
        f"torch {torch.__version__} | python {platform.python_version()} | model {args.model} ({llm.dtype}) | "
        f"load {load_s:.1f}s | {len(out.token_ids)} tokens, ttft {out.ttft_s * 1e3:.0f} ms, decode {tok_s:.1f} tok/s"
    )
    print(f"user: {args.prompt}\nkeel: {out.text}")
    for rel, digest in libraries.items():
        print(f"  mapped {package_dir / rel}  sha256:{digest[:16]}")
    Path(args.out).write_text(
        json.dumps(
            {
                "torch": torch.__version__,
                "torch_cuda": torch.version.cuda,
                "python": platform.python_version(),
                "keel_dir": str(package_dir),
                "model": args.model,
                "dtype": str(llm.dtype),
                "prompt": args.prompt,
                "token_ids": out.token_ids,
                "text": out.text,
                "ttft_s": out.ttft_s,
                "decode_tok_s": tok_s,
                "mapped_libraries": libraries,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
