"""keel's own installed native libraries (every *.abi3.so under the package, vendored ones included),
read by keel-audit under keel's strict policy: only stable C shim symbols of torch, floor 2.10, and
the DT_NEEDED sets of docs/architecture.md (`_C*.abi3.so` -> libtorch_cpu.so, `_C_cuda*.abi3.so` -> + libtorch_cuda.so)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from keel_audit import audit

# the installed package, located without importing it (importing keel loads its libraries)
PACKAGE = Path(next(iter(importlib.util.find_spec("keel").submodule_search_locations)))
SYSTEM = {
    "libstdc++.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libc.so.6",
    "ld-linux-x86-64.so.2",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
}


def _expected_torch_needed(lib: Path) -> set[str]:
    if lib.name.startswith("_C_cuda"):
        return {"libtorch_cpu.so", "libtorch_cuda.so"}
    if lib.name.startswith("_C"):
        return {"libtorch_cpu.so"}
    raise AssertionError(f"{lib}: expected a library named _C*.abi3.so or _C_cuda*.abi3.so")


def _libraries() -> list[Path]:
    return sorted(PACKAGE.rglob("*.abi3.so"))


def test_cpu_library_is_built():
    assert (PACKAGE / "_C.abi3.so").is_file()


@pytest.mark.parametrize("lib", _libraries(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_library_is_stable_with_expected_needed(lib):
    result = audit([str(lib)], target_torch="2.10", strict=True)
    assert result, result.render()
    (la,) = result.libraries
    assert la.verdict == "STABLE"
    assert la.torch_floor == "2.10"
    assert not la.unstable_symbols and not la.unknown_shim and not la.header_only_exported
    assert not la.runpath, f"{lib.name} has RPATH/RUNPATH {la.runpath}"
    torch_needed = {n for n in la.needed if n.startswith(("libtorch", "libc10"))}
    assert torch_needed == _expected_torch_needed(lib)
    assert set(la.needed) - torch_needed <= SYSTEM, f"unexpected DT_NEEDED {set(la.needed) - torch_needed - SYSTEM}"
    assert not any("cudart" in n for n in la.needed), "cudart must be linked statically"
