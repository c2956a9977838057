#!/usr/bin/env python
"""One pipeline probe: run keel's ops and a greedy generation, then report what native code ran.

  python scripts/release/demo_generate.py OUT.json [--model ID] [--prompt TEXT] [--max-tokens N] [--no-ops]
                                          [--reference A/probe.json]

Run with the interpreter of an environment that has keel installed (never from the checkout's
root on sys.path). It prints the answer and writes OUT.json with the torch and Python versions,
every op's error against plain torch and its bound (scripts/release/demo_ops.py), the prompt and generated
token ids, the top-2 logit margin at each generated token, tokens/s and time to first token, and the
sha256 of every keel library mapped into THIS process, read from /proc/self/maps after the ops and
the generation ran: that is the code that really served the request, whatever files the wheel or
the checkout hold. The logits along its tokens go to OUT's folder (logits.pt). With --reference
(another environment's OUT.json) it also computes its logits on that run's prompt and tokens and
writes their max / mean |difference| from that run's logits.pt. Exit 1 when an op exceeds its bound
(OUT.json is written first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import demo_ops  # scripts/release/demo_ops.py (this script's folder is on sys.path)
import torch
from keel_dev.engine import keel_prompt_logits
from keel_dev.parity import logit_diff, top2_margins

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-ops", action="store_true", help="skip the op-by-op comparison with plain torch")
    ap.add_argument("--reference", help="another run's OUT.json: compare logits on its tokens")
    args = ap.parse_args()
    package_dir = Path(keel.__file__).resolve().parent
    op_checks = [] if args.no_ops else demo_ops.checks()  # every op once against plain torch, same process
    if op_checks:
        print(demo_ops.table(op_checks))
    t0 = time.perf_counter()
    llm = LLM(args.model)
    load_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)  # greedy, always max_tokens
    out = llm.chat([[{"role": "user", "content": args.prompt}]], params)[0]
    decode_s = out.total_s - out.ttft_s
    tok_s = (len(out.token_ids) - 1) / decode_s if decode_s > 0 else float("nan")
    path = out.prompt_token_ids + out.token_ids
    logits = keel_prompt_logits(llm, path)[:-1]  # [prompt + tokens - 1, V]: each row predicts the next token
    torch.save(logits, Path(args.out).with_name("logits.pt"))
    margins = top2_margins(logits[len(out.prompt_token_ids) - 1 :])
    reference = None
    if args.reference:  # another run's logits against ours on its tokens (teacher-forced: always comparable)
        ref = json.loads(Path(args.reference).read_text())
        ref_path = ref["prompt_token_ids"] + ref["token_ids"]
        mine = logits if ref_path == path else keel_prompt_logits(llm, ref_path)[:-1]
        mx, mean = logit_diff(mine, torch.load(Path(args.reference).with_name("logits.pt")))
        reference = {"probe": args.reference, "max_abs": mx, "mean_abs": mean, "positions": len(ref_path) - 1}
        print(f"logits on the reference's tokens: max |diff| {mx:.4g}, mean {mean:.4g} ({args.reference})")
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
                "prompt_token_ids": out.prompt_token_ids,
                "token_ids": out.token_ids,
                "margins": margins,
                "reference": reference,
                "op_checks": demo_ops.as_json(op_checks),
                "text": out.text,
                "ttft_s": out.ttft_s,
                "decode_tok_s": tok_s,
                "mapped_libraries": libraries,
            },
            indent=1,
        )
    )
    bad = [c for c in op_checks if not c.ok]
    for c in bad:
        print(f"EXCEEDED: {c.op} {c.device} {c.dtype}: relative error {c.rel:.1e} > {c.bound:.0e}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
