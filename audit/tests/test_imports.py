"""The package's import graph: no cycle anywhere (function-local imports included), and the ELF layer
depends on nothing of the audit but its error hierarchy, so other verbs can reuse it."""

from __future__ import annotations

import ast
from pathlib import Path

import keel_audit

PACKAGE = Path(keel_audit.__file__).resolve().parent


def modules(root: Path = PACKAGE, name: str = "keel_audit") -> dict[str, Path]:
    """Dotted module name -> file, for every .py of the package (packages by their __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(node: ast.If) -> bool:
    return isinstance(node.test, (ast.Name, ast.Attribute)) and ast.unparse(node.test).endswith("TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under `if TYPE_CHECKING:` (never run)."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports: `from .x import y` is an edge to `.x.y` when that is a
    module, else to `.x`; absolute `keel_audit...` imports count the same way."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in known:
                out.add(sub)
            elif target in known:
                out.add(target)
    out.discard(name)
    return out


def graph(root: Path = PACKAGE, name: str = "keel_audit") -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    known = modules(root, name)
    return {mod: imports(mod, path, known) for mod, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_package() -> None:
    edges = graph()
    assert {"keel_audit.elf.reader", "keel_audit.result", "keel_audit.render", "keel_audit.cli"} <= edges.keys()
    assert "keel_audit.render" in edges["keel_audit.result"]  # the table is drawn from the result's document
    assert "keel_audit.elf.symbols" in edges["keel_audit.elf.segments"]


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert found == [], "import cycles in keel_audit: " + "; ".join(" <-> ".join(c) for c in found)


def test_cycle_detection_sees_function_local_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "demo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a  # a function-local import still counts\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    assert cycles(graph(pkg, "demo")) == [["demo.a", "demo.sub.b"]]


def test_elf_layer_needs_only_itself_and_the_errors() -> None:
    outside = {
        mod: sorted(t for t in targets if not t.startswith("keel_audit.elf") and t != "keel_audit.errors")
        for mod, targets in graph().items()
        if mod.startswith("keel_audit.elf")
    }
    assert {m: t for m, t in outside.items() if t} == {}
