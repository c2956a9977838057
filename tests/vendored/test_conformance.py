"""Adapter conformance: every schema of every keel op namespace (keel's own and each vendored
library's) takes only types the stable dispatcher carries as-is, and the adapter helper refuses,
at compile time, a kernel with a narrow `int` / `float` parameter."""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import keel
import keel.vendored
from keel import _compat
from keel.vendored._loader import loaded_vendored

ROOT = Path(__file__).resolve().parents[2]
CXX = shutil.which("g++") or shutil.which("c++")
# Tensor, Tensor?, int (int64), float (double), bool and optional scalars: nothing else
ALLOWED = {"Tensor", "Optional[Tensor]", "int", "Optional[int]", "float", "Optional[float]", "bool", "Optional[bool]"}


def _vendored_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(keel.vendored.__path__) if not m.name.startswith("_"))


def _known_ops() -> dict[str, list[str]]:
    known = {"keel": list(keel.ops.__all__)}
    for name in _vendored_modules():
        importlib.import_module(f"keel.vendored.{name}")
    for lib in loaded_vendored().values():
        known[lib.namespace] = list(lib.ops)
    return known


def _schemas() -> list[_compat.OpSchema]:
    return _compat.registered_schemas("keel", _known_ops())


def test_every_vendored_library_registers_its_namespace():
    known = _known_ops()
    namespaces = {s.name.split("::")[0] for s in _schemas()}
    assert set(known) <= namespaces, f"namespaces without schemas: {set(known) - namespaces}"
    for ns, ops in known.items():
        names = {s.name for s in _schemas() if s.name.startswith(f"{ns}::")}
        assert {f"{ns}::{op}" for op in ops} <= names, f"{ns}: ops listed in Python but not registered"


def test_schemas_take_only_widened_types():
    schemas = _schemas()
    assert schemas, "no keel schema found"
    bad = [
        f"{s.text}: argument {arg} has type {typ}" for s in schemas for arg, typ in s.arg_types if typ not in ALLOWED
    ]
    assert not bad, "schemas the stable dispatcher cannot carry as-is:\n" + "\n".join(bad)


def test_public_fallback_finds_the_same_schemas(monkeypatch):
    private = _schemas()
    monkeypatch.delattr(torch._C, "_jit_get_all_schemas")
    public = _compat.registered_schemas("keel", _known_ops())
    assert [s.text for s in public] == [s.text for s in private]


def test_rule_flags_list_and_scalar_types():
    # the rule itself, on torch's own schemas: aten::max_pool2d takes int[], aten::add.Tensor a Scalar
    types = {s.name + "." + s.overload: dict(s.arg_types) for s in _compat.registered_schemas("aten", {})}
    assert types["aten::max_pool2d."]["kernel_size"] not in ALLOWED
    assert types["aten::add.Tensor"]["alpha"] not in ALLOWED


def _compile(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "kernel.cpp"
    path.write_text(source)
    version = hex((2 << 56) | (10 << 48))
    cmd = [
        CXX,
        "-fsyntax-only",
        "-std=c++17",
        f"-I{ROOT / 'csrc'}",
        f"-I{ROOT / 'adapters'}",
        f"-isystem{Path(torch.__file__).parent / 'include'}",
        f"-DTORCH_TARGET_VERSION={version}",
        str(path),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


KERNEL = """
#include "common/adapter.h"
keel::Tensor probe(const keel::Tensor& x, {param} n, std::optional<keel::Tensor> y) {{ return x; }}
STABLE_TORCH_LIBRARY(keel_probe, m) {{ m.def("probe(Tensor x, int n, Tensor? y) -> Tensor"); }}
KEEL_ADAPTER_LIBRARY_IMPL(keel_probe, m) {{ KEEL_ADAPTER_IMPL(m, "probe", &probe); }}
"""

needs_source = pytest.mark.skipif(
    not (CXX and (ROOT / "adapters" / "common" / "adapter.h").is_file()),
    reason="needs a C++ compiler and the source tree",
)


@needs_source
def test_adapter_helper_accepts_widened_kernel(tmp_path):
    out = _compile(KERNEL.format(param="int64_t"), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]


@needs_source
@pytest.mark.parametrize("param", ["int", "float", "const int&", "std::optional<int>", "int32_t"])
def test_adapter_helper_rejects_narrow_kernel(tmp_path, param):
    out = _compile(KERNEL.format(param=param), tmp_path)
    assert out.returncode != 0, f"a kernel taking `{param}` was accepted by KEEL_ADAPTER_IMPL"
    assert "stable dispatcher cannot carry" in out.stderr, out.stderr[-3000:]
