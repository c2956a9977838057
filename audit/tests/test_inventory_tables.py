"""The inventory's knowledge: the curated replacement table names only stable API that exists, in
the release it names, according to the table generated from torch's headers; that generated table
agrees with the headers of the torch installed here; and the generator's merge rules."""

from __future__ import annotations

import importlib.util
import json
import re
from importlib import resources
from pathlib import Path

import pytest
from audit_support import load_script

from keel_audit.inventory.declarations import declarations
from keel_audit.inventory.knowledge import knowledge, parse_version

DATA = resources.files("keel_audit.data")


def _tables() -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    load = lambda name: json.loads(DATA.joinpath(name).read_text(encoding="utf-8"))  # noqa: E731
    return load("inventory_rules.json"), load("stable_api.json"), load("torch_shim_symbols.json")


def _since(name: str, stable: dict, shim: dict) -> str | None:  # type: ignore[type-arg]
    for kind in ("headers", "macros", "names", "shim"):
        entry = stable[kind].get(name)
        if entry is not None and "removed" not in entry:
            return str(entry["since"])
    entry = shim["symbols"].get(name)
    return None if entry is None else str(entry["since"])


def curated_problems(rules: dict, stable: dict, shim: dict) -> list[str]:  # type: ignore[type-arg]
    """Every replacement of the curated table whose stable names are missing from the generated
    table, or newer than the release the curated table names."""
    problems = []
    sections = [("includes", rules["includes"]["exact"]), ("names", rules["names"]), ("macros", rules["macros"])]
    sections.append(("methods", rules["methods"]))
    for section, table in sections:
        for key, entry in table.items():
            named = parse_version(entry.get("since"))
            if entry["status"] != "none" and (named is None or not entry["needs"] and entry["status"] != "stable"):
                problems.append(f"{section} {key}: a replacement without a release")
            for need in entry.get("needs", []):
                since = _since(need, stable, shim)
                if since is None:
                    problems.append(f"{section} {key}: needs {need}, which no torch release's headers have")
                elif named is None or parse_version(since) > named:  # type: ignore[operator]
                    problems.append(f"{section} {key}: needs {need}, first in torch {since}, not {entry['since']}")
    return problems


def test_every_curated_replacement_exists_in_the_release_it_names() -> None:
    assert curated_problems(*_tables()) == []


def test_the_check_fails_on_a_wrong_release_or_a_missing_name() -> None:
    rules, stable, shim = _tables()
    rules = json.loads(json.dumps(rules))
    rules["macros"]["TORCH_CHECK"]["needs"] = ["STD_TORCH_CHECK_DOES_NOT_EXIST"]
    rules["names"]["at::empty"]["since"] = "2.9"  # torch::stable::empty came with 2.10
    assert curated_problems(rules, stable, shim) == [
        "names at::empty: needs torch::stable::empty, first in torch 2.10, not 2.9",
        "macros TORCH_CHECK: needs STD_TORCH_CHECK_DOES_NOT_EXIST, which no torch release's headers have",
    ]


def _installed_torch() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed (the audit's bare environment)")
    return Path(spec.origin).parent


def test_generated_table_matches_the_installed_torch_headers() -> None:
    torch_dir = _installed_torch()
    version = re.search(r"__version__\s*=\s*['\"](\d+)\.(\d+)", (torch_dir / "version.py").read_text())
    assert version is not None
    installed = (int(version.group(1)), int(version.group(2)))
    _, stable, _ = _tables()
    if f"{installed[0]}.{installed[1]}" not in {".".join(v.split(".")[:2]) for v in stable["torch"]}:
        pytest.skip(f"torch {installed} is not one of the releases the table was generated from")
    include = torch_dir / "include"
    headers = sorted(
        str(p.relative_to(include))
        for sub in ("torch/csrc/stable", "torch/headeronly")
        for p in (include / sub).rglob("*")
        if p.suffix in (".h", ".hpp", ".cuh")
    )
    found: dict[str, set[str]] = {"headers": set(headers), "macros": set(), "names": set(), "shim": set()}
    for rel in headers:
        decl = declarations((include / rel).read_text(encoding="utf-8", errors="replace"))
        found["macros"] |= set(decl.macros)
        found["names"] |= set(decl.names)
        found["shim"] |= set(decl.shim)
    wrong = []
    for kind, present in found.items():
        for name, entry in stable[kind].items():
            since = parse_version(entry["since"])
            removed = parse_version(entry.get("removed"))
            expected = since <= installed and (removed is None or removed > installed)  # type: ignore[operator]
            if expected != (name in present):
                wrong.append(
                    f"{kind} {name}: since {entry['since']}, {'missing from' if expected else 'in'} {installed}"
                )
    assert wrong == []


def test_generator_merge_keeps_first_release_highest_guard_and_removals() -> None:
    gen = load_script("gen_stable_api")
    old = declarations("#define OLD_MACRO 1\nnamespace torch::stable { void f(); void gone(); }\n")
    new = declarations(
        "#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0\n#define NEW_MACRO 1\n#endif\n#define OLD_MACRO 1\n"
        "namespace torch::stable {\n#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_11_0\nvoid f();\n#endif\n}\n"
    )
    table = gen.merge(
        [
            {"version": "2.11.0", "headers": ["b.h"], "decl": new, "versions": {}},
            {"version": "2.10.0", "headers": ["a.h"], "decl": old, "versions": {}},
        ]
    )
    assert table["torch"] == ["2.10.0", "2.11.0"]
    assert table["macros"]["OLD_MACRO"] == {"since": "2.10", "guard": None}
    assert table["macros"]["NEW_MACRO"] == {"since": "2.11", "guard": "2.11"}
    assert table["names"]["torch::stable::f"] == {"since": "2.10", "guard": "2.11"}
    assert table["names"]["torch::stable::gone"] == {"since": "2.10", "guard": None, "removed": "2.11"}
    assert table["headers"] == {"a.h": {"since": "2.10", "removed": "2.11"}, "b.h": {"since": "2.11"}}


def test_declarations_of_a_header() -> None:
    decl = declarations(
        """#pragma once
#define STD_THING(x) x
HIDDEN_NAMESPACE_BEGIN(torch, stable)
class Tensor {
 public:
  Tensor() {}
  int64_t numel() const { return 0; }
#if TORCH_FEATURE_VERSION >= TORCH_VERSION_2_12_0
  template <typename T> T* fancy() const;
#endif
};
using torch::headeronly::ScalarType;
inline Tensor empty_like(const Tensor& t) { return t; }
HIDDEN_NAMESPACE_END(torch, stable)
extern "C" {
AOTI_TORCH_EXPORT AOTITorchError torch_call_thing(int x);
}
"""
    )
    assert decl.macros == {"STD_THING": None}
    assert decl.names == {
        "torch::stable::Tensor": None,
        "torch::stable::Tensor::numel": None,
        "torch::stable::Tensor::fancy": (2, 12),
        "torch::stable::ScalarType": None,
        "torch::stable::empty_like": None,
    }
    assert decl.shim == {"torch_call_thing": None}


def test_knowledge_lookups() -> None:
    know = knowledge()
    rule, prefix = know.name_rule("at::ScalarType::Float")  # type: ignore[misc]
    assert (rule.replacement, prefix) == ("torch::headeronly::ScalarType", "at::ScalarType")
    assert know.name_rule("at::native::TransposeType::NoTranspose")[0].status == "none"  # type: ignore[index]
    assert know.name_rule("at::add")[0].status == "dispatcher"  # type: ignore[index]
    assert know.is_header_only("c10::BFloat16") and not know.is_header_only("c10::cuda::CUDAStream")
    assert know.include_rule("torch/csrc/stable/library.h") is None
    assert know.include_rule("torch/csrc/autograd/variable.h") is know.include_fallback
    assert know.stable_api("torch_call_dispatcher").target == (2, 10)  # type: ignore[union-attr]


def test_inventory_imports_nothing_but_the_standard_library_and_itself() -> None:
    """The pre-commit hook runs the inventory with nothing installed (audit/scripts/inventory_hook.py):
    it may import the standard library, keel_audit.errors, keel_audit.wheelzip and its own modules only."""
    import ast
    import sys

    package = Path(importlib.util.find_spec("keel_audit.inventory").origin).parent  # type: ignore[union-attr,arg-type]
    allowed = {"keel_audit.errors", "keel_audit.wheelzip"}
    bad = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                name = node.module or ""
                if node.level == 1:
                    continue
                if node.level == 2:
                    name = f"keel_audit.{name}"
                names = [name]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if name.startswith("keel_audit") and name not in allowed:
                    bad.append(f"{path.name}: {name}")
                elif not name.startswith("keel_audit") and top not in sys.stdlib_module_names:
                    bad.append(f"{path.name}: {name}")
    assert bad == []
