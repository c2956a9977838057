"""`python -m keel_dev.fuzz.loaders --worker HF GGUF WORKDIR`: the loader fuzzer's worker process."""

from __future__ import annotations

import sys

from keel_dev.fuzz.loaders.harness import worker

if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "--worker":
        sys.exit("usage: python -m keel_dev.fuzz.loaders --worker HF GGUF WORKDIR (run scripts/dev/fuzz_loaders.py)")
    worker(*sys.argv[2:])
