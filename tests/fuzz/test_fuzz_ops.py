"""A small fixed-seed fuzz run of every keel op (scripts/fuzz_ops.py runs the big one): no crash, no
hang, and every error names the op."""

from __future__ import annotations

import harness

from keel._oplist import NAMESPACES


def test_every_listed_op_exists_and_has_a_valid_example():
    import torch
    from examples import EXAMPLES

    for ns, op in harness.all_ops():
        assert hasattr(getattr(torch.ops, ns), op), f"{ns}::{op} is listed in keel._oplist but not registered"
    assert set(EXAMPLES) == {f"keel::{op}" for op in NAMESPACES["keel"]}


def test_unmutated_examples_are_accepted():
    # the fuzzer starts from valid calls: if they failed, mutations would explore nothing
    import random

    import torch
    from examples import EXAMPLES

    for name, example in EXAMPLES.items():
        ns, op = name.split("::")
        for device in ("cpu", "meta"):
            for dtype in (torch.float32, torch.bfloat16):
                getattr(getattr(torch.ops, ns), op).default(*example(random.Random(1), torch, device, dtype))


def test_fuzz_sample_has_no_defects():
    report = harness.fuzz(cases_per_op=150, seed=20261201)
    assert report.counts["ok"] > 0 and report.counts["named"] > 0, report.summary()
    assert not report.defects, report.summary()
