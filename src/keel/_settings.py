"""What keel checks before any native library loads: the torch floor and the KEEL_CPU_ISA level; and the
KEEL_HUGE_PAGES switch with the kernel's transparent-huge-page mode (src/keel/engine/host_memory.py reads them).

The one home of both: src/keel/_native.py, the vendored loaders (src/keel/vendored/_loader.py) and `keel doctor`
read them here. This module imports nothing but the standard library, so `keel doctor` can load it by
file path when `import keel` itself fails. The C++ side reads KEEL_CPU_ISA through one header,
csrc/stable/cpu_isa_level.h, with the same levels.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

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


THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGES_CHOICES = "0 / off or 1 / on / auto"


class HugePagesSettingError(ValueError):
    """KEEL_HUGE_PAGES holds a value other than 0 / off / 1 / on / auto."""


def huge_pages_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether KEEL_HUGE_PAGES asks for huge pages: unset, "", 1, on, auto: yes; 0, off: no; anything else
    raises HugePagesSettingError naming the variable, the value and the choices."""
    value = (os.environ if environ is None else environ).get("KEEL_HUGE_PAGES", "").strip().lower()
    if value in ("", "1", "on", "auto"):
        return True
    if value in ("0", "off"):
        return False
    raise HugePagesSettingError(
        f"keel: KEEL_HUGE_PAGES={value!r} is not a known setting; expected {HUGE_PAGES_CHOICES}"
    )


def thp_mode(path: Path = THP_ENABLED) -> str:
    """The kernel's transparent-huge-page mode: "always", "madvise", "never", or "unavailable" (no such file,
    as off Linux or in a kernel built without THP)."""
    try:
        text = path.read_text()
    except OSError:
        return "unavailable"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "unavailable"


def huge_pages_available(environ: Mapping[str, str] | None = None) -> bool:
    """Huge pages can be asked for here (Python's mmap has MADV_HUGEPAGE, the kernel's mode is madvise or always)
    and KEEL_HUGE_PAGES does not refuse them (an unknown value raises HugePagesSettingError)."""
    return huge_pages_wanted(environ) and hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")
