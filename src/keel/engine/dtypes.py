"""The engine's dtype names (`dtype="bf16"`, `"auto"`, ...) and the default per device."""

from __future__ import annotations

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware does it natively, else fp32 (CPU) / fp16 (old GPUs)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    from keel import _compat  # local: torch's probes are private API, behind keel._compat

    return torch.bfloat16 if _compat.cpu_has_native_bf16() else torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A torch dtype from a name, a dtype or None / "auto" (the device's default)."""
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; expected one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]
