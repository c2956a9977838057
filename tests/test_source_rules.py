"""Layering rules of the C++/CUDA tree (docs/architecture.md): only csrc/stable/ includes torch headers,
nobody includes unstable torch headers or pybind11, and .cu files include no torch header."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    p
    for d in ("csrc", "adapters", "vendored_deps")
    if (ROOT / d).is_dir()
    for p in (ROOT / d).rglob("*")
    if p.suffix in {".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu"}
)
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
UNSTABLE = re.compile(r"^(ATen/|c10/|torch/extension\.h|torch/library\.h|torch/all\.h|torch/torch\.h|pybind11/)")


def _includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def test_tree_has_sources():
    if not (ROOT / "csrc").is_dir():
        pytest.skip("not a source checkout")
    assert SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_include_rules(path):
    rel = path.relative_to(ROOT).as_posix()
    for inc in _includes(path):
        assert not UNSTABLE.match(inc), f"{rel} includes unstable header <{inc}>"
        if inc.startswith("torch/"):
            assert rel.startswith("csrc/stable/"), (
                f"{rel} includes <{inc}>: only csrc/stable/ may include torch headers"
            )
    if path.suffix in {".cu", ".cuh"}:
        # a .cu may include csrc/stable/kernel_types.h (torch-free) but nothing that pulls torch in
        for inc in _includes(path):
            if inc.startswith("stable/"):
                assert inc == "stable/kernel_types.h", f"{rel} includes {inc}, which includes torch headers"


def test_cpu_kernels_are_torch_free():
    # *_cpu.cpp are compiled without torch's include path; keep their includes to kernel headers
    for path in (ROOT / "csrc" / "ops").glob("*_cpu.cpp") if (ROOT / "csrc").is_dir() else ():
        for inc in _includes(path):
            assert not inc.startswith("stable/") or inc == "stable/kernel_types.h", f"{path.name} includes {inc}"


KEEL_HEADERS = re.compile(r"^(stable/|ops/|common/adapter\.h|adapters/)")


def test_vendored_deps_know_neither_keel_nor_torch():
    # vendored_deps/ keeps its upstream shape: it includes no torch header and nothing of keel;
    # adapters/ is the only code that sees both worlds
    for path in (p for p in SOURCES if p.relative_to(ROOT).parts[0] == "vendored_deps"):
        for inc in _includes(path):
            rel = path.relative_to(ROOT).as_posix()
            assert not inc.startswith("torch/") and not KEEL_HEADERS.match(inc), f"{rel} includes <{inc}>"
