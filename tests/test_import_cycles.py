"""No import cycle inside keel: the package's import graph (read from the source, tests/support/import_graph.py)
has no group of modules that import each other, directly or around a loop. Function-level imports count;
imports under `if TYPE_CHECKING:` do not (they never run). Another package joins by adding its root."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.import_graph import cycles, describe

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "src" / "keel", ROOT / "audit" / "src" / "keel_audit"]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_cycle(package: Path):
    if not (package / "__init__.py").is_file():
        pytest.skip(f"{package} is not in this checkout (not a source checkout)")
    found = cycles(package)
    assert not found, f"{len(found)} import cycle(s) in {package.name}:\n{describe(found)}"
