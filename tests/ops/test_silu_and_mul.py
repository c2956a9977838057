"""keel::silu_and_mul against F.silu(gate) * up."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.devices import DEVICES, DTYPES, assert_rounded_like
from support.layouts import LAYOUTS, make

from keel import ops


def reference_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


SHAPES = [(1, 2), (3, 64), (5, 7, 34), (0, 16), (2, 0), (4, 3072)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(device, dtype, shape, layout):
    x = make(shape, dtype, device, layout, seed=8)
    out = ops.silu_and_mul(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype and out.is_contiguous()
    assert_rounded_like(out, reference_silu_and_mul(x), dtype, max_ulps=3)


def test_opcheck():
    torch.library.opcheck(torch.ops.keel.silu_and_mul.default, (torch.randn(4, 16),))


@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(3, 7), r"keel::silu_and_mul: x last dim must be even \(gate and up halves\), got shape \[3, 7\]"),
        (torch.randn(()), r"keel::silu_and_mul: x must have at least 1 dimension"),
        (
            torch.randn(4, 8, dtype=torch.float64),
            r"keel::silu_and_mul: x must be float32, bfloat16 or float16, got float64",
        ),
    ],
)
def test_bad_inputs(x, match):
    with pytest.raises(RuntimeError, match=match):
        ops.silu_and_mul(x)
