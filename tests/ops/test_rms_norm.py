"""keel::rms_norm against Hugging Face's LlamaRMSNorm formula."""

from __future__ import annotations

import pytest
import torch
from support.devices import DEVICES, DTYPES, assert_rounded_like
from support.layouts import LAYOUTS, make

from keel import ops


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


SHAPES = [(1, 8), (3, 64), (5, 7, 33), (0, 16), (2, 0, 8), (4, 4096), (17,)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_reference(device, dtype, shape, layout):
    x = make(shape, dtype, device, layout, seed=3)
    w = make((shape[-1],), dtype, device, "contiguous", seed=4)
    out = ops.rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_rounded_like(out, reference_rms_norm(x, w, 1e-6), dtype, max_ulps=3)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_weight_and_large_eps(device):
    x = torch.randn(6, 32, device=device)
    w = torch.randn(64, device=device)[::2]
    torch.testing.assert_close(ops.rms_norm(x, w, 0.5), reference_rms_norm(x, w, 0.5))


def test_opcheck():
    torch.library.opcheck(torch.ops.keel.rms_norm.default, (torch.randn(4, 16), torch.randn(16), 1e-5))


@pytest.mark.parametrize(
    "x, w, eps, match",
    [
        (
            torch.randn(3, 8),
            torch.randn(4),
            1e-6,
            r"keel::rms_norm: weight must be 1-D with 8 elements .* got shape \[4\]",
        ),
        (torch.randn(3, 8), torch.randn(2, 4), 1e-6, r"keel::rms_norm: weight must be 1-D with 8 elements"),
        (
            torch.randn(3, 8),
            torch.randn(8).half(),
            1e-6,
            r"keel::rms_norm: weight must have the dtype of x \(float32\), got float16",
        ),
        (
            torch.randn(3, 8).double(),
            torch.randn(8).double(),
            1e-6,
            r"keel::rms_norm: x must be float32, bfloat16 or float16, got float64",
        ),
        (torch.randn(()), torch.randn(1), 1e-6, r"keel::rms_norm: x must have at least 1 dimension"),
        (torch.randn(3, 8), torch.randn(8), -1.0, r"keel::rms_norm: eps must be a non-negative number"),
    ],
)
def test_bad_inputs(x, w, eps, match):
    with pytest.raises(RuntimeError, match=match):
        ops.rms_norm(x, w, eps)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mixed_devices():
    with pytest.raises(RuntimeError, match=r"keel::rms_norm: weight must be on the device of x \(cuda:0\), got cpu"):
        ops.rms_norm(torch.randn(2, 8, device="cuda"), torch.randn(8), 1e-6)
