"""What keel checks before any native library loads: the torch floor and the KEEL_CPU_ISA level.

The one home of both: keel/_native.py, the vendored loaders (keel/vendored/_loader.py) and `keel doctor`
read them here. This module imports nothing but the standard library, so `keel doctor` can load it by
file path when `import keel` itself fails. The C++ side reads KEEL_CPU_ISA through one header,
csrc/stable/cpu_isa_level.h, with the same levels.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import metadata

# Oldest torch whose stable ABI the libraries use; builds target it (TORCH_TARGET_VERSION). A wheel's own
# `torch>=` requirement (written by keel's audit at build time) takes precedence where it is installed.
TORCH_FLOOR = (2, 10)

# The KEEL_CPU_ISA levels; unset or "" means auto. Each caps the CPU kernels of every library keel loads
# (keel's ops, keel.vendored.deep_gemm, keel.vendored.flash_attn) at the same level; amx also requires AMX for
# keel's bf16 prompt GEMMs. What each level runs in each library: docs/ops.md (KEEL_CPU_ISA).
CPU_ISA_LEVELS = ("auto", "base", "avx2", "avx512", "amx")

_TORCH_REQUIREMENT = re.compile(r"^torch\s*>=\s*(\d+)\.(\d+)")


def torch_floor() -> tuple[int, int]:
    """The installed keel wheel's `torch>=` floor (its metadata, written by keel's audit at build time), else
    TORCH_FLOOR (a source checkout, or metadata without one)."""
    try:
        for req in metadata.requires("keel") or ():
            m = _TORCH_REQUIREMENT.match(req)
            if m:
                return int(m.group(1)), int(m.group(2))
    except metadata.PackageNotFoundError:
        pass
    return TORCH_FLOOR


class CpuIsaError(ValueError):
    """KEEL_CPU_ISA holds a value that is not one of CPU_ISA_LEVELS."""


def cpu_isa_level(environ: Mapping[str, str] | None = None) -> str:
    """The KEEL_CPU_ISA level of `environ` (default os.environ): one of CPU_ISA_LEVELS, "auto" when unset or
    empty. An unknown value raises CpuIsaError naming KEEL_CPU_ISA, the value and the levels."""
    value = (os.environ if environ is None else environ).get("KEEL_CPU_ISA") or "auto"
    if value not in CPU_ISA_LEVELS:
        raise CpuIsaError(
            f"keel: KEEL_CPU_ISA={value!r} is not a known CPU instruction-set level; expected one of "
            f"{', '.join(CPU_ISA_LEVELS)} (or unset for auto)"
        )
    return value
