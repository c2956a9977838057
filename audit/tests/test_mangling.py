"""Namespace detection on mangled names agrees with the demangled text, template arguments included;
the demangler agrees with binutils' `c++filt` (the oracle)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from audit_support import interpreter_extensions, torch_library

from keel_audit.elf import read_elf
from keel_audit.mangling import demangle, scan_mangled, scan_refs, torch_refs, unstable_torch_namespace

CASES = {
    "_ZN2at6native3addERKNS_6TensorE": "at",
    "_ZN5mylib7consumeERKSt6vectorIN2at6TensorESaIS2_EE": "at",
    "_ZNK3c1013intrusive_ptrIiE3getEv": "c10",
    "_ZTIN5torch8autograd4NodeE": "torch",
    "_ZThn8_N5torch4lazy4Node4nameEv": "torch",
    "_ZN5torch6stable6TensorC1Ev": None,
    "_ZN5torch10headeronly6detail3fooEv": None,
    "_ZN5mylib12atomic_thingEv": None,
    "_ZN3foo2atEv": None,  # a function named `at` is not the namespace at::
    "_ZN5mylib3fooILi2EEEvv": None,
    "strlen": None,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_namespace(name: str) -> None:
    assert unstable_torch_namespace(name) == CASES[name]
    assert scan_mangled(name) == CASES[name] if name.startswith("_Z") else True


def _cxxfilt(names: list[str]) -> list[str]:
    if not shutil.which("c++filt"):
        pytest.skip("c++filt (binutils) not available")
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


MANGLED = sorted(n for n in CASES if n.startswith("_Z")) + [
    "_ZN3c108toStringENS_10ScalarTypeE",
    "_ZNK3c1018HeaderOnlyArrayRefIlE6equalsES1_",
    "_ZN4vllm6kernelIN3c108BFloat16EEEvPT_",
]


def test_display_matches_cxxfilt() -> None:
    expected = _cxxfilt(MANGLED)
    got = [demangle(n) for n in MANGLED]
    assert got == expected
    assert all(g != n for g, n in zip(got, MANGLED, strict=True)), "a mangled name came back undemangled"
    assert demangle("not_mangled") == "not_mangled"


def test_torch_refs_from_demangled_text() -> None:
    assert torch_refs("_ZNK3c1018HeaderOnlyArrayRefIlE6equalsES1_") == ("c10::HeaderOnlyArrayRef",)
    assert torch_refs("_ZN4vllm6kernelIN3c108BFloat16EEEvPT_") == ("c10::BFloat16",)
    assert scan_refs("_ZN4vllm6kernelIN3c108BFloat16EEEvPT_") == ("c10::BFloat16",)
    assert scan_refs("_ZNK3c1018HeaderOnlyArrayRefIlE6equalsES1_") == ("c10::HeaderOnlyArrayRef",)


def test_scanner_agrees_with_demangler_on_torch() -> None:
    lib = torch_library("libc10.so")
    if lib is None:
        pytest.skip("no torch importable by this interpreter (libc10.so is the sample)")
    info = read_elf(lib)
    names = [s.name for s in info.undefined + info.defined if s.name.startswith("_Z")]
    assert names
    assert [n for n in names if bool(scan_mangled(n)) != bool(unstable_torch_namespace(n))] == []


def test_torch_library_found_wherever_the_interpreter_finds_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torch sample above is found through the import system, in any environment and under any
    Python (a path into one checkout's .venv/lib/python3.11 skipped everywhere else)."""
    sample = next(iter(interpreter_extensions()), None)
    if sample is None:
        pytest.skip("this interpreter has no lib-dynload extension modules to stand in for libc10.so")
    fake = tmp_path / "site" / "torch"
    (fake / "lib").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('found, never imported')\n")
    shutil.copy(sample, fake / "lib" / "libc10.so")
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # find_spec returns an imported module's spec
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert torch_library("libc10.so") == fake / "lib" / "libc10.so"
    assert torch_library("libnothing.so") is None
