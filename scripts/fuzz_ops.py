#!/usr/bin/env python
"""Fuzz every op of every keel namespace (keel._oplist.NAMESPACES) in child processes and print counts.

    python scripts/fuzz_ops.py [--cases-per-op N] [--seed S] [--timeout SECONDS]

Outcomes: ok, named (an error naming the op), and the defects: unnamed (an error that does not name
the op), crash (the worker process died), hang (no answer within --timeout). Exit 1 on any defect.
The harness lives in tests/fuzz/harness.py (the test suite runs a small sample of it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fuzz"))

import harness  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases-per-op", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one case may take before it is a hang")
    args = ap.parse_args()
    start = time.monotonic()
    report = harness.fuzz(args.cases_per_op, args.seed, args.timeout, log=print)
    print(report.summary())
    print(f"{time.monotonic() - start:.0f} s")
    return 1 if report.defects else 0


if __name__ == "__main__":
    sys.exit(main())
