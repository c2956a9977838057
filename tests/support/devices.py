"""Devices, dtypes and tolerances for op tests (CUDA only when a GPU is present)."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# the CUDA case carries the `cuda` marker, so `pytest -m cuda` (scripts/device/check.sh) selects it
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (atol, rtol) per dtype for comparisons against a float32 reference
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    """Compare in float32 with the tolerance of `dtype` (times `scale`)."""
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol * scale, rtol=rtol * scale)


# A kernel that rounds its float32 result to nearest even (as torch does) differs from torch's
# own 16-bit result only where the float32 values differ slightly (summation order, exp): a few
# elements in a thousand, by one unit in the last place. Truncation, or a rounding of the wrong
# intermediate, makes about half the elements differ. float32 keeps assert_close's tolerance.
MAX_MISMATCH = {torch.bfloat16: 0.01, torch.float16: 0.01}
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}


def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at the magnitude of each element of `t` (as float32)."""
    info = torch.finfo(dtype)
    _, exp = torch.frexp(t.float().abs().clamp_min(info.smallest_normal))
    return torch.ldexp(torch.ones_like(t, dtype=torch.float32), exp - 1 - _MANTISSA_BITS[dtype])


def assert_rounded_like(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, max_ulps: float | None = 1
) -> None:
    """`actual` and `expected` (torch's result in `dtype`) agree as two correct roundings do: for
    16-bit dtypes at most 1% of elements (or one) differ, each by at most `max_ulps`; nan/inf where torch
    has them. An op that rounds an intermediate (rms_norm's normalized value, silu before the multiply)
    turns a one-ulp difference there into up to 3 ulps of the output: max_ulps=3 for those. A long
    sum with cancellation (linear) can be off by many ulps of a small result: max_ulps=None skips
    that bound (the caller checks an absolute tolerance)."""
    if dtype not in MAX_MISMATCH:
        assert_close(actual, expected, dtype)
        return
    a, e = actual.float().cpu(), expected.to(dtype).float().cpu()
    assert a.shape == e.shape
    assert torch.equal(a.isnan(), e.isnan()), "nan positions differ"
    finite = ~e.isnan()
    assert torch.equal(a[finite].isinf(), e[finite].isinf()) and torch.equal(a[a.isinf()], e[a.isinf()])
    ok = e.isfinite() & a.isfinite()
    diff = (a - e).abs()[ok]
    ulps = diff / ulp(e[ok], dtype)
    if max_ulps is not None and ulps.numel():
        assert bool((ulps <= max_ulps).all()), f"off by {ulps.max().item()} ulps (at most {max_ulps} allowed)"
    differ, n = int((diff != 0).sum()), diff.numel()
    allowed = max(1, int(MAX_MISMATCH[dtype] * n))
    assert differ <= allowed, f"{differ} of {n} elements differ from torch's rounding (at most {allowed} allowed)"
