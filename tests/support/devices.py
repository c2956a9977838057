"""Devices, dtypes and tolerances for op tests (CUDA only when a GPU is present)."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU"))]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (atol, rtol) per dtype for comparisons against a float32 reference
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    """Compare in float32 with the tolerance of `dtype` (times `scale`)."""
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol * scale, rtol=rtol * scale)
