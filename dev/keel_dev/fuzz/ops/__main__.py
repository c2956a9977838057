"""`python -m keel_dev.fuzz.ops --worker`: the fuzzer's worker process (keel_dev.fuzz.ops.runner.worker)."""

from __future__ import annotations

import sys

from keel_dev.fuzz.ops.runner import worker

if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m keel_dev.fuzz.ops --worker (the fuzzer starts it; run scripts/dev/fuzz_ops.py)")
    worker()
