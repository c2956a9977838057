"""What the fuzzer fuzzes: every op every keel library registers, read from torch after loading them all.

`load_libraries()` imports `keel` and the module of every namespace in keel._oplist.MODULES and of
every keel.vendored package, so a library added under keel/vendored/ is loaded (and its ops fuzzed)
even before anyone lists it; `registered()` then asks torch for every schema of every namespace whose
name starts with "keel" (keel._compat.registered_schemas: torch's schema registry, or, without that
private API, the ops keel._oplist lists).
"""

from __future__ import annotations

import importlib
import pkgutil

from keel import _compat, _oplist


def vendored_modules() -> list[str]:
    """keel.vendored.<name> for every vendored package in the installed keel."""
    import keel.vendored

    return sorted(
        f"keel.vendored.{m.name}" for m in pkgutil.iter_modules(keel.vendored.__path__) if not m.name.startswith("_")
    )


def load_libraries() -> list[str]:
    """Import keel and every library's module (loading each native library); returns the modules."""
    modules = sorted({"keel", *_oplist.MODULES.values(), *vendored_modules()})
    for name in modules:
        importlib.import_module(name)
    return modules


def registered() -> dict[str, _compat.OpSchema]:
    """Every registered default overload of every keel namespace, by "namespace::op" (libraries loaded)."""
    load_libraries()
    schemas = _compat.registered_schemas("keel", _oplist.NAMESPACES)
    return {s.name: s for s in schemas if s.overload == ""}
