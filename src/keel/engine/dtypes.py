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
    """bf16 where the GPU does it, else fp16; on the CPU bf16 where keel's kernels read it at speed (native bf16
    arithmetic, or the AVX2 build, which widens each 2-byte weight in registers: half the bytes of fp32 for a
    memory-bound decode), else fp32 (the baseline x86-64 build)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    from keel import _compat  # local: torch's probes are private API, behind keel._compat

    return torch.bfloat16 if _compat.cpu_has_native_bf16() or _cpu_kernels_avx2() else torch.float32


def _cpu_kernels_avx2() -> bool:
    """Whether keel's CPU kernels run their AVX2 build in this process (the CPU has AVX2+FMA+F16C and
    KEEL_CPU_ISA does not cap them at base), as keel's library answers it."""
    from keel import _native

    return _native.cpu_isa_status().avx2


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A torch dtype from a name, a dtype or None / "auto" (the device's default)."""
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; expected one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]
