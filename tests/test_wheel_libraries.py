"""keel's own installed native libraries, read by keel's audit (replaces a bare nm check):
only stable C shim symbols of torch, floor 2.10, and the DT_NEEDED sets of DESIGN.md."""

from __future__ import annotations

from pathlib import Path

import pytest

import keel
from keel_audit import audit

PACKAGE = Path(keel.__file__).resolve().parent
SYSTEM = {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6", "ld-linux-x86-64.so.2",
          "libdl.so.2", "libpthread.so.0", "librt.so.1"}
EXPECTED_TORCH_NEEDED = {"_C.abi3.so": {"libtorch_cpu.so"}, "_C_cuda.abi3.so": {"libtorch_cpu.so", "libtorch_cuda.so"}}


def _libraries() -> list[Path]:
    return sorted(PACKAGE.glob("*.abi3.so"))


def test_cpu_library_is_built():
    assert (PACKAGE / "_C.abi3.so").is_file()


@pytest.mark.parametrize("lib", _libraries(), ids=lambda p: p.name)
def test_library_is_stable_with_expected_needed(lib):
    result = audit([str(lib)], target_torch="2.10", require_stable=True)
    assert result, result.render()
    (la,) = result.libraries
    assert la.verdict == "STABLE"
    assert la.torch_floor == "2.10"
    assert not la.unstable_symbols and not la.unknown_shim
    assert not la.runpath, f"{lib.name} has RPATH/RUNPATH {la.runpath}"
    torch_needed = {n for n in la.needed if n.startswith(("libtorch", "libc10"))}
    assert torch_needed == EXPECTED_TORCH_NEEDED[lib.name]
    assert set(la.needed) - torch_needed <= SYSTEM, f"unexpected DT_NEEDED {set(la.needed) - torch_needed - SYSTEM}"
    assert not any("cudart" in n for n in la.needed), "cudart must be linked statically"
