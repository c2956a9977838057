"""keel's Python layers point one way (docs/architecture.md): the engine imports models and layers, models import
layers, never the other way; nothing below the API imports the server or the CLI. Read from the source
(tests/support/import_graph.py), TYPE_CHECKING imports included: naming a type is depending on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.import_graph import import_graph

KEEL = Path(__file__).resolve().parents[1] / "src" / "keel"
# importer package -> packages it must never import
FORBIDDEN = {
    "keel.layers": ("keel.engine", "keel.models", "keel.entrypoints", "keel.cli"),
    "keel.models": ("keel.engine", "keel.entrypoints", "keel.cli"),
    "keel.engine": ("keel.entrypoints", "keel.cli"),
}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("importer", sorted(FORBIDDEN))
def test_layers_point_down(importer: str):
    if not (KEEL / "__init__.py").is_file():
        pytest.skip("not a source checkout")
    graph = import_graph(KEEL, type_checking=True)
    assert any(_within(m, importer) for m in graph), f"no module under {importer}"
    bad = sorted(
        str(e)
        for module, edges in graph.items()
        if _within(module, importer)
        for e in edges
        if any(_within(e.target, f) for f in FORBIDDEN[importer])
    )
    assert not bad, f"{importer} must not import {', '.join(FORBIDDEN[importer])}:\n" + "\n".join(bad)
