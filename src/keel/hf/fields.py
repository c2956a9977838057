"""Typed, range-checked reads of JSON fields; every error names the file and the field."""

from __future__ import annotations

import math
from typing import Any

from .errors import CheckpointError

MISSING: Any = object()  # `default` for a required field


class FieldReader:
    """Reads fields of one parsed JSON object `obj` from `file`, raising `error` (a CheckpointError)."""

    def __init__(self, obj: dict[str, Any], file: str, error: type[CheckpointError], prefix: str = "") -> None:
        self.obj, self.file, self.error, self.prefix = obj, file, error, prefix

    def fail(self, key: str, expected: str, value: Any = MISSING) -> CheckpointError:
        got = "it is missing" if value is MISSING else f"got {_show(value)}"
        return self.error(f"{self.file}: {self.prefix}{key} must be {expected}, {got}")

    def _get(self, key: str, default: Any, expected: str) -> tuple[bool, Any]:
        """(True, `default`) when the field is absent or null (a required field: an error), else (False, value)."""
        value = self.obj.get(key)
        if value is None:
            if default is MISSING:
                raise self.fail(key, expected, MISSING if key not in self.obj else None)
            return True, default
        return False, value

    def get_int(self, key: str, lo: int, hi: int, default: Any = MISSING, expected: str | None = None) -> Any:
        expected = expected or f"an integer in [{lo}, {hi}]"
        absent, value = self._get(key, default, expected)
        if absent:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(key, expected, value)
        return value

    def get_float(
        self, key: str, lo: float, hi: float, default: Any = MISSING, lo_open: bool = False, hi_open: bool = False
    ) -> Any:
        expected = f"a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        absent, value = self._get(key, default, expected)
        if absent:
            return value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok:
            ok = (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi)
        if not ok:
            raise self.fail(key, expected, value)
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        absent, value = self._get(key, default, "true or false")
        if not absent and not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def get_str(self, key: str, default: Any = MISSING, choices: tuple[str, ...] | None = None) -> Any:
        expected = f"one of {', '.join(repr(c) for c in choices)}" if choices else "a string"
        absent, value = self._get(key, default, expected)
        if absent:
            return value
        if not isinstance(value, str) or (choices is not None and value not in choices):
            raise self.fail(key, expected, value)
        return value

    def get_dict(self, key: str) -> dict[str, Any] | None:
        value = self.obj.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.fail(key, "a JSON object or null", value)
        return value

    def token_ids(self, key: str, vocab_size: int | None, allow_list: bool = True) -> tuple[int, ...]:
        """A token id (or, with `allow_list`, a list of them), each in [0, vocab_size); () when absent or null."""
        hi = (vocab_size - 1) if vocab_size else 2**31 - 1
        expected = f"a token id in [0, {hi}]" + (" or a list of them" if allow_list else "") + " or null"
        value = self.obj.get(key)
        if value is None:
            return ()
        items = value if isinstance(value, list) and allow_list else [value]
        for v in items:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
                raise self.fail(key, expected, value)
        return tuple(items)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
