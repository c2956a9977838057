"""keel::fused_add_rms_norm (in place) against residual add + LlamaRMSNorm."""

from __future__ import annotations

import pytest
import torch
from support.devices import DEVICES, DTYPES, assert_rounded_like
from support.layouts import LAYOUTS, make

from keel import ops


def reference_fused_add_rms_norm(x, residual, weight, eps):
    new_residual = x + residual  # rounded to the dtype, as in the HF decoder layer
    xf = new_residual.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), new_residual


SHAPES = [(1, 8), (3, 64), (5, 7, 33), (0, 16), (4, 2048)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(device, dtype, shape, layout):
    x = make(shape, dtype, device, layout, seed=5)
    residual = make(shape, dtype, device, "transposed" if layout == "strided" else "contiguous", seed=6)
    w = make((shape[-1],), dtype, device, "contiguous", seed=7)
    want_x, want_res = reference_fused_add_rms_norm(x.clone(), residual.clone(), w, 1e-5)
    x_ptr, r_ptr = x.data_ptr(), residual.data_ptr()
    assert ops.fused_add_rms_norm(x, residual, w, 1e-5) is None
    assert x.data_ptr() == x_ptr and residual.data_ptr() == r_ptr
    assert_rounded_like(residual, want_res, dtype)
    assert_rounded_like(x, want_x, dtype, max_ulps=3)


def test_opcheck():
    args = (torch.randn(4, 16), torch.randn(4, 16), torch.randn(16), 1e-5)
    torch.library.opcheck(torch.ops.keel.fused_add_rms_norm.default, args)


@pytest.mark.parametrize(
    "x, res, w, match",
    [
        (
            torch.randn(3, 8),
            torch.randn(3, 7),
            torch.randn(8),
            r"keel::fused_add_rms_norm: residual must have the shape of x \[3, 8\], got \[3, 7\]",
        ),
        (
            torch.randn(3, 8),
            torch.randn(3, 8).half(),
            torch.randn(8),
            r"keel::fused_add_rms_norm: residual must have the dtype of x",
        ),
        (
            torch.randn(3, 8),
            torch.randn(3, 8),
            torch.randn(9),
            r"keel::fused_add_rms_norm: weight must be 1-D with 8 elements",
        ),
        (
            torch.randn(1, 8).expand(3, 8),
            torch.randn(3, 8),
            torch.randn(8),
            r"keel::fused_add_rms_norm: x is written in place but has overlapping elements",
        ),
    ],
)
def test_bad_inputs(x, res, w, match):
    with pytest.raises(RuntimeError, match=match):
        ops.fused_add_rms_norm(x, res, w, 1e-6)


def test_overlap_check_through_dispatcher():
    # a non-contiguous view with no zero stride: answered by aten::_debug_has_internal_overlap
    x = torch.randn(8, 16)[:, ::2]
    res = torch.randn(8, 8)
    want_x, want_res = reference_fused_add_rms_norm(x.clone(), res.clone(), torch.ones(8), 1e-6)
    ops.fused_add_rms_norm(x, res, torch.ones(8), 1e-6)
    torch.testing.assert_close(x, want_x)
    torch.testing.assert_close(res, want_res)
