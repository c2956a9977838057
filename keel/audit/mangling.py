"""Itanium C++ names: find torch namespaces (at, c10, torch) and demangle for display.

Display uses the C++ runtime's own `__cxa_demangle` through ctypes when libstdc++ is loadable
(no subprocess); a small scanner of the mangled form is the fallback for classification.
"""

from __future__ import annotations

import ctypes
import re
from functools import lru_cache

# every reference to these namespaces spells the source name literally at least once
_TORCH_TOKENS = ("2at", "3c10", "5torch")
_STABLE_TORCH = ("6stable", "10headeronly")
_UNSTABLE_NS = re.compile(r"(?<![\w:])(at|c10|torch)::(?!(?:stable|headeronly)::)")


class _Demangler:
    """Lazily bound `__cxa_demangle` from libstdc++; unavailable -> None."""

    def __init__(self) -> None:
        self._fn: object | None = None
        self._free: object | None = None
        self._tried = False

    def __call__(self, name: str) -> str | None:
        if not self._tried:
            self._bind()
        if self._fn is None:
            return None
        status = ctypes.c_int(0)
        ptr = self._fn(name.encode(), None, None, ctypes.byref(status))  # type: ignore[operator]
        if not ptr:
            return None
        try:
            return ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self._free(ptr)  # type: ignore[operator]

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


@lru_cache(maxsize=1 << 17)
def unstable_torch_namespace(name: str) -> str | None:
    """The unstable torch namespace a mangled name references (template args included), or None.

    `torch::stable` and `torch::headeronly` are the stable C++ surface and do not count.
    """
    if not mentions_torch(name):
        return None
    text = demangle(name)
    if text != name:
        match = _UNSTABLE_NS.search(text)
        return match.group(1) if match else None
    return scan_mangled(name)


_NESTED = re.compile(r"N[rVKRO]*$")
_SEQ = re.compile(r"C[1-5]|D[0-5]|T[hv]n?\d+_(?:n?\d+_)?|S[0-9A-Z]*_|T\d*_|Dv\d+_|L[a-z]n?\d*E")


def scan_mangled(name: str) -> str | None:
    """Fallback: walk source names of the mangled form; first unstable torch namespace or None.

    A namespace is the first source name of a nested name (`N[rVKRO]*`), followed by another
    name or an operator. Substitutions (`S_`) are not expanded: the demangler path covers them.
    """
    i, n = 2, len(name)
    prev: str | None = None
    while i < n:
        if name[i].isdigit():
            j = i
            while j < n and name[j].isdigit():
                j += 1
            end = j + int(name[i:j])
            ident = name[j:end]
            nxt = name[end : end + 1]
            opens = (
                prev is None and _NESTED.search(name, 0, i) is not None and (nxt.isdigit() or nxt.islower())
            )
            if opens and ident in ("at", "c10"):
                return ident
            if opens and ident == "torch" and not name[end:].startswith(_STABLE_TORCH):
                return ident
            prev, i = ident, end
        else:
            m = _SEQ.match(name, i)
            prev, i = None, (m.end() if m else i + 1)
    return None
