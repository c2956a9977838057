"""Fuzz every op of every keel namespace (what the loaded libraries register) in child processes.

    python -m keel_fuzz.ops [--cases-per-op N] [--seed S] [--timeout SECONDS] [--op NS::OP ...]

Outcomes: ok, named (an error naming the op), and the defects: unnamed (an error that does not name
the op), crash (the worker process died), hang (no answer within --timeout), harness (the fuzzer's
own bug). Exit 1 on any defect. The suite runs a small sample (tests/fuzz/). `--worker` is the worker
process the fuzzer starts (keel_fuzz.ops.runner.worker).
"""

from __future__ import annotations

import argparse
import sys
import time

from keel_fuzz.ops import fuzz
from keel_fuzz.ops.runner import worker


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m keel_fuzz.ops", description=__doc__.splitlines()[0])
    ap.add_argument("--cases-per-op", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one case may take before it is a hang")
    ap.add_argument("--op", action="append", help="fuzz only this op (namespace::op); repeatable")
    args = ap.parse_args()
    start = time.monotonic()
    report = fuzz(args.cases_per_op, args.seed, args.timeout, log=print, ops=args.op)
    print(report.summary())
    print(f"{time.monotonic() - start:.0f} s")
    return 1 if report.defects else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
