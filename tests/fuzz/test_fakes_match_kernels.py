"""Every op's fake (meta) implementation refuses what its CPU kernel refuses, with the same message.

The bad inputs are the fuzzer's: for each seed, the case is built on CPU tensors and run through the
kernel, then rebuilt as meta tensors (same shapes, strides, dtypes) and run through the fake. A
kernel error about argument metadata must come back word for word from the fake; an error only the
kernel can see (values inside index tensors, memory overlap) may be missing on meta, or replaced by a
later check's error naming the op; a call the kernel accepts the fake accepts, with the same output
shapes and dtypes.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
from keel_fuzz.ops.cases import Case, build_call, names_op, on_meta
from keel_fuzz.ops.examples import all_examples
from keel_fuzz.ops.inventory import registered

SEEDS = range(160)
# what a kernel reads from tensor contents or memory addresses, which meta tensors do not have
KERNEL_ONLY = re.compile(
    "|".join(
        (
            r"share memory",
            r"has overlapping elements",
            r"\]=-?\d+ is outside",
            r"\] are both",
            r"cu_seqlens_q\[0\] must be 0",
            r"cu_seqlens_q\[-1\] must be total_q",
            r"must be non-decreasing",
            r"max_seqlen_[qk] = -?\d+ but sequence",
            r"seqused_k\[\d+\]",
            r"cu_seqlens_k must start at 0",
            r"cache_seqlens\[\d+\]",
            r"block_table\[\d+\]\[\d+\]",
            r"more than its block_table row holds",
        )
    )
)
SCHEMAS = registered()


def _call(fn, args):
    try:
        out = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the message is what is compared
        return f"{type(exc).__name__}: {exc}".split("\nDeclaration")[0], None
    return None, out


def _meta_of(out):
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.dtype)
    if isinstance(out, (tuple, list)):
        return tuple(_meta_of(o) for o in out)
    return type(out)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_fake_refuses_what_the_kernel_refuses_with_its_message(name):
    ns, op = name.split("::")
    seen = Counter()
    for seed in SEEDS:
        case = Case(seed, ns, op)
        fn, args = build_call(case, SCHEMAS[name], all_examples(), device="cpu")
        if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            continue  # a mutation put one argument on another device: not a CPU kernel call
        cpu_error, cpu_out = _call(fn, args)
        meta_error, meta_out = _call(fn, on_meta(args))
        where = f"{name} seed {seed}:\n  cpu:  {cpu_error}\n  meta: {meta_error}"
        if cpu_error is None:
            assert meta_error is None, where
            assert _meta_of(meta_out) == _meta_of(cpu_out), where
            seen["accepted"] += 1
        elif KERNEL_ONLY.search(cpu_error):
            assert meta_error is None or names_op(meta_error, case), where
            seen["kernel-only"] += 1
        else:
            assert meta_error == cpu_error, where
            seen["same error"] += 1
    assert seen["accepted"] > 0 and seen["same error"] > 0, f"{name}: too few cases compared: {dict(seen)}"
