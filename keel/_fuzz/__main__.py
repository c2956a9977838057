"""`python -m keel._fuzz --worker`: the fuzzer's worker process (keel._fuzz.runner.worker)."""

from __future__ import annotations

import sys

from keel._fuzz.runner import worker

if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m keel._fuzz --worker (the fuzzer starts it; run scripts/dev/fuzz_ops.py instead)")
    worker()
