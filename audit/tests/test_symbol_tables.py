"""The shipped tables, checked against an independent oracle: `nm -D` of a real torch library (and
pyelftools where nm is missing), never keel_audit's own ELF reader that generated them."""

from __future__ import annotations

import importlib.util
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from keel_audit.symbol_tables import cpython_table, is_shim_name, shim_table

RELEASES = ("2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")


def _installed_torch() -> tuple[str, Path] | None:
    """(version, torch/lib) of the torch installed beside the tests, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"+]+)", (root / "version.py").read_text(), re.M)
    if match is None:
        return None
    version = match.group(1)
    return version, root / "lib"


def _exports(lib: Path) -> set[str]:
    """Defined dynamic symbols of `lib` by `nm -D --defined-only`, else pyelftools' own iteration."""
    if shutil.which("nm"):
        out = subprocess.run(
            ["nm", "-D", "--defined-only", "--format=posix", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        return {line.split()[0].split("@")[0] for line in out.splitlines() if line.strip()}
    with open(lib, "rb") as fh:
        dynsym = ELFFile(fh).get_section_by_name(".dynsym")
        return {s.name for s in dynsym.iter_symbols() if s.name and s["st_shndx"] != "SHN_UNDEF"}


def test_versions_of_known_symbols() -> None:
    table = shim_table()
    assert table.torch_versions == RELEASES
    assert table.symbols["aoti_torch_get_data_ptr"] == "2.9"  # unguarded, exported by the oldest release read
    assert table.symbols["torch_call_dispatcher"] == "2.10"
    assert table.symbols["torch_from_blob"] == "2.11"
    assert table.symbols["torch_exception_get_what"] == "2.13"
    assert table.libraries["aoti_torch_get_data_ptr"] == "libtorch_cpu.so"
    assert "THPVariableClass" in table.python_globals


def test_header_only_names() -> None:
    table = shim_table()
    for name in ("c10::BFloat16", "c10::Half", "c10::ScalarType", "c10::toString", "c10::HeaderOnlyArrayRef"):
        assert table.is_header_only(name) and table.header_only.get(name, "2.10") == "2.10", name
    for name in ("c10::intrusive_ptr", "c10::ArrayRef", "c10::IValue", "c10::TensorImpl", "c10::Device", "at::Tensor"):
        assert not table.is_header_only(name), name
    assert not any(n.endswith("::operator") for n in table.header_only)


def test_sample_against_nm_of_installed_torch() -> None:
    found = _installed_torch()
    if found is None:
        pytest.skip("no torch installed beside the tests")
    version, lib_dir = found
    if version not in RELEASES:
        pytest.skip(f"torch {version} is not one of the releases the table was generated from")
    minor = ".".join(version.split(".")[:2])
    key = tuple(int(p) for p in minor.split("."))
    table = shim_table()
    exported = _exports(lib_dir / "libtorch_cpu.so")
    cpu = sorted(n for n, lib in table.libraries.items() if lib == "libtorch_cpu.so")
    rng = random.Random(0)
    older = [n for n in cpu if tuple(int(p) for p in table.symbols[n].split(".")) <= key]
    newer = [n for n in cpu if tuple(int(p) for p in table.symbols[n].split(".")) > key]
    assert newer, "no symbol newer than the installed torch: the table is not from several releases"
    # a symbol is "since X" only if torch X exports it, and one newer than X must be missing from X
    for name in rng.sample(older, min(200, len(older))):
        assert name in exported, f"table: {name} since {table.symbols[name]}, torch {version} lacks it"
    for name in newer:
        assert name not in exported, f"table: {name} since {table.symbols[name]}, torch {version} has it"
    shims = {n for n in exported if is_shim_name(n)}
    assert sorted(shims - set(table.symbols)) == []


def test_cpython_table() -> None:
    symbols = cpython_table().symbols
    assert symbols["PyLong_FromLong"] == "3.2"
    assert symbols["PyErr_GetRaisedException"] == "3.12"
    assert "PyCode_Addr2Line" not in symbols
