"""The shipped tables: every shim symbol torch 2.13.0 / 2.14.1 exports is covered, with its version."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel_audit.elf import read_elf
from keel_audit.table import cpython_table, is_shim_name, shim_table

REPO = Path(__file__).resolve().parents[2]
TORCH_LIBS = {
    "2.13.0": REPO / ".venv/lib/python3.11/site-packages/torch/lib",
    "2.14.1": REPO / ".venv-214/lib/python3.11/site-packages/torch/lib",
}


def test_versions_of_known_symbols() -> None:
    table = shim_table()
    assert table.torch_versions == ("2.13.0", "2.14.1")
    assert table.symbols["aoti_torch_get_data_ptr"] == "2.9"
    assert table.symbols["torch_call_dispatcher"] == "2.10"
    assert table.symbols["torch_from_blob"] == "2.11"
    assert "THPVariableClass" in table.python_globals


@pytest.mark.parametrize("version", sorted(TORCH_LIBS))
def test_covers_torch_exports(version: str) -> None:
    lib_dir = TORCH_LIBS[version]
    libs = [lib_dir / n for n in ("libtorch_cpu.so", "libtorch_cuda.so") if (lib_dir / n).exists()]
    if not libs:
        pytest.skip(f"torch {version} is not installed beside the repository")
    exported = {s.name for lib in libs for s in read_elf(lib).defined if is_shim_name(s.name)}
    assert len(exported) > 300
    assert sorted(exported - set(shim_table().symbols)) == []


def test_cpython_table() -> None:
    symbols = cpython_table().symbols
    assert symbols["PyLong_FromLong"] == "3.2"
    assert symbols["PyErr_GetRaisedException"] == "3.12"
    assert "PyCode_Addr2Line" not in symbols
