"""A small fixed-seed fuzz run of every op of every keel namespace (`python -m keel_fuzz.ops` runs the big one):
no crash, no hang, and every error names the op."""

from __future__ import annotations

import random

import pytest
import torch
from keel_fuzz.ops import fuzz
from keel_fuzz.ops.examples import all_examples
from keel_fuzz.ops.inventory import load_libraries, registered


@pytest.mark.parametrize("name", sorted(all_examples()))
def test_unmutated_examples_are_accepted(name):
    # the fuzzer starts from valid calls: if they failed, mutations would explore nothing
    load_libraries()  # the vendored libraries register their ops when their module is imported
    ns, op = name.split("::")
    overload = getattr(getattr(torch.ops, ns), op).default
    for seed in range(8):
        for device in ("cpu", "meta"):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                overload(*all_examples()[name](random.Random(seed), device, dtype))


@pytest.mark.slow  # 150 fuzz cases per op in worker processes (the unmutated calls stay in the quick tier)
def test_fuzz_sample_has_no_defects():
    report = fuzz(cases_per_op=150, seed=20261201)
    assert set(report.ops) == set(registered()), "the run did not cover every registered op"
    for op, counts in report.per_op.items():
        assert counts["ok"] > 0 and counts["named"] > 0, f"{op}: only one kind of outcome\n{report.summary()}"
    assert not report.defects, report.summary()
