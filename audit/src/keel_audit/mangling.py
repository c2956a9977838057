"""Itanium C++ names: find torch namespaces (at, c10, torch) and demangle for display.

Display uses the C++ runtime's own `__cxa_demangle` through ctypes when libstdc++ is loadable
(no subprocess); a small scanner of the mangled form is the fallback for classification.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from functools import lru_cache

# every reference to these namespaces spells the source name literally at least once
_TORCH_TOKENS = ("2at", "3c10", "5torch")


class _Demangler:
    """Lazily bound `__cxa_demangle` from libstdc++; unavailable -> None."""

    def __init__(self) -> None:
        # ctypes foreign functions: __cxa_demangle(name, buf, len, &status) -> char*, free(ptr)
        self._fn: Callable[..., int | None] | None = None
        self._free: Callable[[int], None] | None = None
        self._tried = False

    def __call__(self, name: str) -> str | None:
        if not self._tried:
            self._bind()
        if self._fn is None or self._free is None:
            return None
        status = ctypes.c_int(0)
        ptr = self._fn(name.encode(), None, None, ctypes.byref(status))
        if not ptr:
            return None
        try:
            return ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self._free(ptr)

    def _bind(self) -> None:
        self._tried = True
        try:
            lib = ctypes.CDLL("libstdc++.so.6")
            libc = ctypes.CDLL(None)
            getattr(lib, "__cxa_demangle")
        except (OSError, AttributeError):
            return
        fn = getattr(lib, "__cxa_demangle")
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        free = libc.free
        free.argtypes = [ctypes.c_void_p]
        self._fn, self._free = fn, free


_cxa_demangle = _Demangler()


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """Best-effort human-readable form of a symbol; the input when it cannot be demangled."""
    if not name.startswith("_Z"):
        return name
    return _cxa_demangle(name) or name


def mentions_torch(name: str) -> bool:
    """Cheap pre-filter: could this mangled name reference at::, c10:: or torch::?"""
    return name.startswith("_Z") and ("2at" in name or "3c10" in name or "5torch" in name)  # _TORCH_TOKENS


_STABLE_NS = ("torch::stable", "torch::headeronly")
_REF = re.compile(r"(?<![\w:])(?:at|c10|torch)::(?:\w+::)*\w+")


@lru_cache(maxsize=1 << 17)
def torch_refs(name: str) -> tuple[str, ...]:
    """Every qualified torch name a mangled symbol spells, template arguments included.

    Each is cut at the first character that is not part of a plain `a::b::c` path:
    `c10::HeaderOnlyArrayRef<long>::equals(...)` gives `c10::HeaderOnlyArrayRef`, an operator
    gives `c10::operator`. Read from the demangled text, or from the mangled form when no
    demangler is available (`scan_refs`).
    """
    if not mentions_torch(name):
        return ()
    text = demangle(name)
    if text != name:
        return tuple(dict.fromkeys(_REF.findall(text)))
    return scan_refs(name)


def is_stable_path(path: str) -> bool:
    """`torch::stable::...` / `torch::headeronly::...`: the stable C++ surface."""
    return path.startswith(_STABLE_NS) and path[len("torch::") :].split("::", 1)[0] in ("stable", "headeronly")


def unstable_torch_namespace(name: str) -> str | None:
    """The first unstable torch namespace (at, c10, torch) a mangled name references, or None.

    `torch::stable` and `torch::headeronly` are the stable C++ surface and do not count.
    """
    for path in torch_refs(name):
        if not is_stable_path(path):
            return path.split("::", 1)[0]
    return None


_NESTED = re.compile(r"N[rVKRO]*$")
_SEQ = re.compile(r"C[1-5]|D[0-5]|T[hv]n?\d+_(?:n?\d+_)?|S[0-9A-Z]*_|T\d*_|Dv\d+_|L[a-z]n?\d*E")


def _source_name(name: str, i: int) -> tuple[str, int] | None:
    """The `<length><identifier>` source name at i, and where it ends; None when there is none."""
    j = i
    while j < len(name) and name[j].isdigit():
        j += 1
    if j == i:
        return None
    end = j + int(name[i:j])
    return name[j:end], end


def scan_refs(name: str) -> tuple[str, ...]:
    """Fallback of `torch_refs` on the mangled form: torch namespaces that open a nested name.

    A namespace is the first source name of a nested name (`N[rVKRO]*`), followed by another
    name or an operator; the path continues over the source names that follow it directly.
    Substitutions (`S_`) are not expanded: they repeat a name already seen.
    """
    i, n = 2, len(name)
    prev: str | None = None
    refs: list[str] = []
    while i < n:
        got = _source_name(name, i)
        if got is None:
            m = _SEQ.match(name, i)
            prev, i = None, (m.end() if m else i + 1)
            continue
        ident, end = got
        nxt = name[end : end + 1]
        opens = prev is None and _NESTED.search(name, 0, i) is not None and (nxt.isdigit() or nxt.islower())
        if opens and ident in ("at", "c10", "torch"):
            path = [ident]
            while (more := _source_name(name, end)) is not None:
                path.append(more[0])
                end = more[1]
            if len(path) == 1:  # an operator follows
                path.append("operator")
            refs.append("::".join(path))
            prev, i = path[-1], end
            continue
        prev, i = ident, end
    return tuple(dict.fromkeys(refs))


def scan_mangled(name: str) -> str | None:
    """`unstable_torch_namespace` from the mangled form alone (no demangler)."""
    for path in scan_refs(name) if name.startswith("_Z") else ():
        if not is_stable_path(path):
            return path.split("::", 1)[0]
    return None
