"""The import graph of a Python package, read from its source with `ast` (nothing is imported), and its
cycles: what tests/test_import_cycles.py and tests/test_import_layers.py check.

Every `import` / `from ... import` statement counts, module level and inside functions alike (a cycle
through a function-level import is still a cycle, only deferred). Imports under `if TYPE_CHECKING:` never
run, so `import_graph(..., type_checking=False)` (the default) leaves them out; the layering rules count
them (a model that names an engine type depends on the engine). Importing `a.b.c` first runs the packages
`a` and `a.b`, so an edge to a module also implies edges to its packages, except the importer's own
packages (Python has started those before the importer runs; counting them would make every package that
re-exports its children a cycle)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Edge:
    """`source` imports `target` at `path`:`line` (`implied`: through a submodule of `target`)."""

    source: str
    target: str
    path: str
    line: int
    implied: bool = False

    def __str__(self) -> str:
        via = " (its package runs first)" if self.implied else ""
        return f"{self.source} -> {self.target}{via}  [{self.path}:{self.line}]"


def modules(package_root: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under `package_root` (a package folder)."""
    base = package_root.parent
    out = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def _imported_names(name: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Dotted names an import statement may refer to (a module, or a module's attribute)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the importer's package, up node.level - 1 levels
        package = name.split(".") if is_package else name.split(".")[:-1]
        base = package[: len(package) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module] + [f"{module}.{alias.name}" for alias in node.names]


def import_graph(package_root: Path, *, type_checking: bool = False) -> dict[str, set[Edge]]:
    """Each module of the package -> its import edges to other modules of the package."""
    mods = modules(package_root)
    root = package_root.parent
    graph: dict[str, set[Edge]] = {name: set() for name in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = set() if type_checking else _type_checking_nodes(tree)
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skip:
                continue
            for dotted in _imported_names(name, path.name == "__init__.py", node):
                target = dotted
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if not target or target == name or target in own_packages:
                    continue
                graph[name].add(Edge(name, target, rel, node.lineno))
                parts = target.split(".")
                for i in range(1, len(parts)):
                    package = ".".join(parts[:i])
                    if package in mods and package not in own_packages and package != name:
                        graph[name].add(Edge(name, package, rel, node.lineno, implied=True))
    return graph


def strongly_connected(graph: dict[str, set[Edge]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth = longest import chain: small for a package
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted({e.target for e in graph[v]}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def cycles(package_root: Path) -> list[tuple[list[str], list[Edge]]]:
    """Every import cycle of the package: each group of modules that reach each other, with every import
    edge inside the group (each is on some cycle)."""
    graph = import_graph(package_root)
    out = []
    for group in strongly_connected(graph):
        members = set(group)
        out.append((group, sorted(e for v in group for e in graph[v] if e.target in members)))
    return out


def describe(found: list[tuple[list[str], list[Edge]]]) -> str:
    """Each group, its modules that import each other directly (a <-> b), then every edge of the group."""
    lines = []
    for group, edges in found:
        pairs = {(e.source, e.target) for e in edges}
        lines.append("cycle among: " + ", ".join(group))
        lines += [f"  {a} <-> {b}" for a, b in sorted(pairs) if a < b and (b, a) in pairs]
        lines += [f"    {e}" for e in edges]
    return "\n".join(lines)
