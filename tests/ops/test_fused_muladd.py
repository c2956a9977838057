"""keel::fused_muladd against a*b+c in float32."""

from __future__ import annotations

import pytest
import torch
from support.devices import DEVICES, DTYPES, assert_rounded_like
from support.layouts import LAYOUTS, make

from keel import ops


def reference_fused_muladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    return (a.float() * b.float() + c).to(a.dtype)


SHAPES = [(0,), (1,), (7,), (3, 5), (2, 0, 4), (4, 33, 17), (40000,), ()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(device, dtype, shape, layout):
    a = make(shape, dtype, device, layout, seed=1)
    b = make(shape, dtype, device, "contiguous" if layout == "strided" else layout, seed=2)
    out = ops.fused_muladd(a, b, 0.75)
    assert out.shape == a.shape and out.dtype == dtype and out.is_contiguous()
    assert_rounded_like(out, reference_fused_muladd(a, b, 0.75), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_large_parallel(device):
    a = torch.randn(1 << 20, device=device)
    b = torch.randn(1 << 20, device=device)
    torch.testing.assert_close(ops.fused_muladd(a, b, -2.0), a * b - 2.0)


def test_inputs_unchanged_and_mixed_layouts():
    a = torch.randn(6, 10)
    b = torch.randn(10, 6).t()
    a0, b0 = a.clone(), b.clone()
    out = ops.fused_muladd(a, b, 1.0)
    torch.testing.assert_close(out, a0 * b0 + 1.0)
    assert torch.equal(a, a0) and torch.equal(b, b0)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_autograd_of_reference(device):
    a = torch.randn(5, 7, device=device, dtype=torch.float64).float().requires_grad_()
    b = torch.randn(5, 7, device=device).requires_grad_()
    ops.fused_muladd(a, b, 0.5).pow(2).sum().backward()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    (a2 * b2 + 0.5).pow(2).sum().backward()
    torch.testing.assert_close(a.grad, a2.grad)
    torch.testing.assert_close(b.grad, b2.grad)


def test_gradcheck_float64():
    # the kernel has a float64 path, so finite differences are accurate enough for gradcheck
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: ops.fused_muladd(x, y, 1.5), (a, b))
    bt = torch.randn(4, 3, dtype=torch.float64).t().requires_grad_()  # strided input
    assert torch.autograd.gradcheck(lambda x, y: ops.fused_muladd(x, y, -0.5), (a, bt))


def test_gradgradcheck_float64():
    # the backward (grad * b, grad * a) is made of differentiable torch ops: double backward is claimed
    a = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, y: ops.fused_muladd(x, y, 0.25), (a, b))


def test_float64_matches_reference():
    a = torch.randn(5, 7, dtype=torch.float64)
    b = torch.randn(7, 5, dtype=torch.float64).t()
    torch.testing.assert_close(ops.fused_muladd(a, b, 0.1), a * b + 0.1, rtol=1e-15, atol=1e-15)


def test_opcheck():
    torch.library.opcheck(torch.ops.keel.fused_muladd.default, (torch.randn(3, 4), torch.randn(3, 4), 2.0))
    a = torch.randn(3, 4, requires_grad=True)
    torch.library.opcheck(torch.ops.keel.fused_muladd.default, (a, torch.randn(3, 4), 0.5))


@pytest.mark.parametrize(
    "a, b, match",
    [
        (
            torch.randn(3, 4),
            torch.randn(4, 3),
            r"keel::fused_muladd: b must have the shape of a \[3, 4\], got \[4, 3\]",
        ),
        (torch.randn(3), torch.randn(3, 1), r"keel::fused_muladd: b must have the shape of a"),
        (torch.randn(3), torch.randn(3).double(), r"keel::fused_muladd: b must have the dtype of a \(float32\)"),
        (
            torch.ones(3, dtype=torch.int64),
            torch.ones(3, dtype=torch.int64),
            r"keel::fused_muladd: a must be float32, bfloat16, float16 or float64, got int64",
        ),
    ],
)
def test_bad_inputs(a, b, match):
    with pytest.raises(RuntimeError, match=match):
        ops.fused_muladd(a, b, 1.0)


def test_meta_device_shape():
    out = ops.fused_muladd(torch.empty(2, 3, device="meta"), torch.empty(2, 3, device="meta"), 1.0)
    assert out.shape == (2, 3) and out.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mixed_devices():
    with pytest.raises(RuntimeError, match=r"keel::fused_muladd: b must be on the device of a \(cuda:0\), got cpu"):
        ops.fused_muladd(torch.randn(4, device="cuda"), torch.randn(4), 1.0)
