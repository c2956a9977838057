"""keel's own sources (csrc/, adapters/, vendored_deps/) through the inventory: nothing unstable, and
for each library of keel's installed wheel the TORCH_TARGET_VERSION its sources need equals the
torch floor the binary audit reads from the built library."""

from __future__ import annotations

import glob
import importlib.util
from pathlib import Path

import pytest

from keel_audit import audit
from keel_audit.inventory.knowledge import fmt, knowledge
from keel_audit.inventory.project import analyse

ROOT = Path(__file__).resolve().parents[2]
# each library's sources, as CMakeLists.txt and adapters/*/library.cmake list them ("!": left out)
LIBRARIES = {
    "keel/_C.abi3.so": ["csrc/bindings.cpp", "csrc/ops/*.cpp"],
    "keel/_C_cuda.abi3.so": ["csrc/ops/*.cu", "csrc/ops/*.cpp", "!csrc/ops/*_cpu.cpp", "!csrc/ops/cpu_isa.cpp"],
    "keel/vendored/deep_gemm/_C.abi3.so": ["adapters/deep_gemm/*.cpp", "vendored_deps/deep_gemm/csrc/*/*.cpp"],
    "keel/vendored/deep_gemm/_C_cuda.abi3.so": [
        "adapters/deep_gemm/deep_gemm.cpp",
        "vendored_deps/deep_gemm/csrc/apis/*.cpp",
        "vendored_deps/deep_gemm/csrc/cuda/*.cu",
    ],
    "keel/vendored/flash_attn/_C.abi3.so": ["adapters/flash_attn/*.cpp", "vendored_deps/flash_attn/src/**/*.cpp"],
    "keel/vendored/flash_attn/_C_cuda.abi3.so": [
        "adapters/flash_attn/flash_attn.cpp",
        "vendored_deps/flash_attn/src/flash_api.cpp",
        "vendored_deps/flash_attn/src/cuda/*.cu",
    ],
}
INCLUDE_DIRS = ["csrc", "adapters"]  # keel's targets put these on the include path


def test_keels_sources_have_no_unstable_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    projects = analyse(["csrc", "adapters", "vendored_deps"], knowledge(), include_dirs=INCLUDE_DIRS)
    assert [(p.label, path, f.what) for p in projects for path, f in p.findings] == []
    assert [len(p.files) > 4 for p in projects] == [True, True, True]


def test_each_librarys_floor_equals_the_binary_audits(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("keel") is None:
        pytest.skip("keel's wheel is not installed here (the audit's bare environment)")
    monkeypatch.chdir(ROOT)
    binary = {lib.path: lib.torch_floor for lib in audit(["keel"]).libraries}
    assert set(LIBRARIES) <= set(binary) or set(binary) <= set(LIBRARIES), binary
    source = {}
    for library, patterns in LIBRARIES.items():
        if library not in binary:
            continue  # a CUDA twin a CPU-only build does not ship
        files = sorted(
            {f for p in patterns if p[0] != "!" for f in glob.glob(p, recursive=True)}
            - {f for p in patterns if p[0] == "!" for f in glob.glob(p[1:])}
        )
        assert files, library
        (project,) = analyse(files, knowledge(), include_dirs=INCLUDE_DIRS)
        assert project.findings == []
        source[library] = fmt(project.target)
    assert source == {lib: floor for lib, floor in binary.items() if lib in source}
    assert set(source.values()) == {"2.10"}  # the floor keel's CMakeLists.txt builds for (KEEL_TORCH_TARGET)
