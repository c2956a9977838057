"""keel's op fuzzer: every op of every keel namespace, in child processes (`python -m keel_fuzz.ops` runs it).

The ops are what the loaded libraries register (inventory.py); each case is a mutated valid call
(examples.py, examples_vendored.py) or random arguments from the op's schema (cases.py), run in a
worker process (runner.py). Outcomes: ok (the op accepted the call), named (an error naming the op),
and the defects: unnamed (an error that does not name the op), crash (the worker died), hang (no
answer in time), harness (building the case failed: a bug of the fuzzer, reported too).
"""

from __future__ import annotations

from keel_fuzz.ops.cases import DEFECTS, OUTCOMES, Case
from keel_fuzz.ops.runner import Report, fuzz

__all__ = ["DEFECTS", "OUTCOMES", "Case", "Report", "fuzz"]
