"""docs/generation.md's `EngineConfig` table is the config's: one row per field, in the field order, each with the
field's default (numbers and booleans as written, strings quoted, bytes in GiB). Source reading plus the
installed keel's `EngineConfig`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "generation.md"


def documented() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    section = text[text.index("### Engine configuration: `EngineConfig`") :]
    return re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", section.split("\n\n|", 1)[1].split("\n\n", 1)[0], re.M)


def written(value: object) -> str:
    """How the table writes a default."""
    if isinstance(value, str):
        return f'`"{value}"`' if value == "auto" else f"`{value}`"  # a keyword value quoted, an id not
    if isinstance(value, bool) or value is None:
        return f"`{value}`"
    if isinstance(value, int) and value >= 1 << 30 and value % (1 << 30) == 0:
        return f"{value >> 30} GiB"
    return str(value)


@pytest.mark.skipif(not PAGE.is_file(), reason="not a source checkout")
def test_the_table_lists_every_field_with_its_default():
    from keel.engine import EngineConfig

    want = [(f.name, written(f.default)) for f in dataclasses.fields(EngineConfig)]
    got = [(name, default.strip()) for name, default in documented()]
    assert got == want, f"docs/generation.md's EngineConfig table differs from EngineConfig: {got} != {want}"
