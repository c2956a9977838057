"""The op inventory (src/keel/_oplist.py) is what the bindings define and what the libraries register, and
every registered op has a fuzz example: a new op or namespace is fuzzed without a hand-kept list."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from keel_fuzz.ops.examples import all_examples
from keel_fuzz.ops.inventory import load_libraries, registered, vendored_modules
from support.scripts import load_script

from keel import _compat, _oplist

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "dev" / "gen_oplist.py"
needs_source = pytest.mark.skipif(not GEN.is_file(), reason="not a source checkout")


@needs_source
def test_oplist_is_generated_from_the_bindings():
    out = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_inventory_is_what_the_libraries_register():
    # torch's registry of every schema (the private path of registered_schemas) against the generated file
    if _compat.private(torch._C, "_jit_get_all_schemas") is None:
        pytest.skip("this torch cannot list every registered schema")
    load_libraries()
    found = {s.name: s.text for s in _compat.registered_schemas("keel", {}) if s.overload == ""}
    assert found == {name: _oplist.schema(name) for name in _oplist.SCHEMAS}
    assert {name.split("::")[0] for name in found} == set(_oplist.MODULES)


def test_every_namespace_module_loads_its_ops():
    for ns, module in _oplist.MODULES.items():
        importlib.import_module(module)
        for op in _oplist.ops(ns):
            assert hasattr(getattr(torch.ops, ns), op), f"importing {module} did not register {ns}::{op}"
    assert set(vendored_modules()) == {m for m in _oplist.MODULES.values() if m != "keel"}


def test_every_registered_op_has_a_fuzz_example():
    assert set(registered()) == set(all_examples()), "registered ops without a fuzz example (or stale examples)"


@needs_source
def test_a_new_library_is_picked_up_from_its_bindings(tmp_path):
    # the generator reads every bindings file: a new adapter's namespace and ops need no list edited
    gen_oplist = load_script("scripts/dev/gen_oplist.py")
    for rel in ("csrc/bindings.cpp", "adapters/flash_attn/bindings.cpp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    (tmp_path / "adapters" / "newlib").mkdir()
    (tmp_path / "adapters" / "newlib" / "bindings.cpp").write_text(
        '// a comment with m.def("ignored(Tensor x) -> Tensor")\n'
        "STABLE_TORCH_LIBRARY(keel_newlib, m) {\n"
        '  m.def("scale(Tensor x, float s, int[] dims=[0, 1]) "\n'
        '        "-> Tensor");\n'
        "}\n"
    )
    schemas, modules = gen_oplist.collect(tmp_path)
    assert modules == {
        "keel": "keel",
        "keel_flash_attn": "keel.vendored.flash_attn",
        "keel_newlib": "keel.vendored.newlib",
    }
    assert schemas["keel_newlib::scale"] == ["Tensor x", "float s", "int[] dims=[0, 1]", "-> Tensor"]
    assert "keel_newlib::ignored" not in schemas
    assert [n for n in schemas if n.startswith("keel::")] == [f"keel::{op}" for op in _oplist.KEEL_OPS]
