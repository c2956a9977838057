"""The CPU's feature flags as the tests and benchmarks read them.

/proc/cpuinfo describes the host even inside an emulator (qemu-user passes it through), so a process run
on an emulated CPU model is told that model's flags through KEEL_EMULATED_CPU_FLAGS (space-separated, as
/proc/cpuinfo spells them); tests/test_emulated_cpu.py sets it.
"""

from __future__ import annotations

import os
from pathlib import Path

EMULATED = "KEEL_EMULATED_CPU_FLAGS"
# what qemu's `-cpu Haswell` model reports that keel's builds care about (no AVX-512, no AMX)
HASWELL = "sse sse2 ssse3 sse4_1 sse4_2 popcnt avx avx2 fma f16c bmi1 bmi2 movbe"


def flags() -> set[str]:
    """The flags of the CPU this process runs on (the first processor's; empty when unknown)."""
    emulated = os.environ.get(EMULATED)
    if emulated is not None:
        return set(emulated.split())
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()
