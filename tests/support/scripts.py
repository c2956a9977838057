"""Load a script (scripts/*/*.py, benchmarks/**/*.py) as a module, for tests of its functions (scripts are not a
package).

A script imports the modules of its own folder by their bare names (`python scripts/release/pipeline.py`
puts scripts/release/ first on sys.path); `load_script` loads those siblings first, by file, under the
same bare names in sys.modules, so nothing is added to sys.path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relpath: str, *siblings: str) -> ModuleType:
    """The script at `relpath` from the repository root (e.g. "scripts/release/pipeline.py") as a module;
    `siblings`: the bare names of the modules of its folder that it imports (loaded first, in this order)."""
    path = ROOT / relpath
    for name in siblings:
        if name not in sys.modules:
            _load(name, path.parent / f"{name}.py")
    return _load(f"_keel_script_{path.parent.name}_{path.stem}", path)


def _load(name: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"load_script: no script {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
