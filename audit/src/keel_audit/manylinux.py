"""The manylinux floor: the oldest manylinux policy whose bounds admit a library's symbol versions.

A manylinux policy bounds four families of symbol versions, not only GLIBC_: GLIBCXX_ and CXXABI_
(libstdc++) and GCC_ (libgcc_s). A library needing GLIBCXX_3.4.30 is manylinux_2_35 at least, even
when its newest GLIBC_ version is 2.34. The bounds come from auditwheel's policy file, reduced by
scripts/gen_manylinux_table.py to data/manylinux_policy.json (auditwheel is not needed at run time).

Like auditwheel, the floor ignores version needs on the dynamic loader (`ld-linux*`, `ld64.so.*`);
the `glibc_max` fact (and the `glibc-above-tag` gate) still counts them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .elf import ElfInfo
from .errors import TableError
from .versions import is_numeric
from .versions import key as _key

TABLE_FILE = Path(__file__).parent / "data" / "manylinux_policy.json"
FAMILIES = ("GLIBC", "GLIBCXX", "CXXABI", "GCC")
_VERSION = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC)_(.+)$")


def is_loader(soname: str) -> bool:
    """The dynamic loader, whose version needs auditwheel does not count."""
    return soname.startswith("ld-linux") or soname in ("ld64.so.1", "ld64.so.2")


@dataclass(frozen=True, slots=True)
class Needs:
    """The symbol versions of the four families one library needs (loader excluded)."""

    highest: dict[str, str]  # family -> highest numeric version ("GLIBCXX" -> "3.4.30")
    named: tuple[str, ...] = ()  # non-numeric version names ("CXXABI_TM_1", "GLIBC_PRIVATE")

    @property
    def versions(self) -> list[str]:
        """Every need as a version name, in family order ("GLIBC_2.34", "GLIBCXX_3.4.30", ...)."""
        return [f"{f}_{self.highest[f]}" for f in FAMILIES if f in self.highest] + list(self.named)


def needs(info: ElfInfo, *, loader: bool = False) -> Needs:
    """What one library needs of GLIBC_, GLIBCXX_, CXXABI_ and GCC_, from its version needs; the
    loader's needs count only with `loader` (the glibc_max fact), never for the manylinux floor."""
    found: dict[str, list[str]] = {}
    named: set[str] = set()
    for soname, name in info.version_needs:
        m = _VERSION.match(name)
        if m is None or (is_loader(soname) and not loader):
            continue
        if is_numeric(m.group(2)):
            found.setdefault(m.group(1), []).append(m.group(2))
        else:
            named.add(name)
    return Needs({f: max(v, key=_key) for f, v in found.items()}, tuple(sorted(named)))


@dataclass(frozen=True, slots=True)
class Bound:
    """One policy for one architecture: its glibc version and the highest version of each family."""

    glibc: str
    highest: dict[str, str | None]

    def excess(self, want: Needs, named_floor: dict[str, str]) -> list[str]:
        """The needed versions this policy does not admit ("GLIBCXX_3.4.30"), in family order."""
        out = [
            f"{f}_{v}"
            for f in FAMILIES
            if (v := want.highest.get(f)) is not None and ((top := self.highest.get(f)) is None or _key(v) > _key(top))
        ]
        out += [n for n in want.named if n not in named_floor or _key(named_floor[n]) > _key(self.glibc)]
        return out


@dataclass(frozen=True, slots=True)
class ManylinuxTable:
    """Every known manylinux policy per architecture, oldest first."""

    source: str
    policies: dict[str, tuple[Bound, ...]]
    named: dict[str, dict[str, str]]  # arch -> non-numeric version name -> oldest policy allowing it

    def bounds(self, arch: str | None) -> tuple[Bound, ...]:
        """The policies known for an architecture (empty for an unknown one)."""
        return self.policies.get(arch or "", ())

    def floor(self, arch: str | None, want: Needs) -> tuple[str | None, list[str]]:
        """(oldest admitting policy's glibc, []) or (None, the versions above every known policy).

        (None, []) when the library needs no version of the four families (nothing bounds it);
        (None, every version needed) when its architecture has no known policy.
        """
        known = self.bounds(arch)
        if not want.versions:
            return None, []
        if not known:
            return None, want.versions
        named = self.named.get(arch or "", {})
        for bound in known:
            if not bound.excess(want, named):
                return bound.glibc, []
        return None, known[-1].excess(want, named)

    def policy_for_tag(self, arch: str | None, glibc: tuple[int, int]) -> Bound | None:
        """The newest known policy at or below a tag's glibc (None below the oldest)."""
        at_or_below = [b for b in self.bounds(arch) if _key(b.glibc) <= glibc]
        return at_or_below[-1] if at_or_below else None

    def newest(self, arch: str | None) -> Bound | None:
        """The newest known policy of an architecture."""
        known = self.bounds(arch)
        return known[-1] if known else None


@lru_cache(maxsize=1)
def manylinux_table(path: Path = TABLE_FILE) -> ManylinuxTable:
    """Load data/manylinux_policy.json (generated by scripts/gen_manylinux_table.py)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("schema") != 1:
            raise ValueError(f"schema {data.get('schema')!r}")
        policies = {
            arch: tuple(sorted((Bound(glibc, dict(row)) for glibc, row in rows.items()), key=lambda b: _key(b.glibc)))
            for arch, rows in data["policies"].items()
        }
        named = {arch: dict(rows) for arch, rows in data["named"].items()}
        return ManylinuxTable(str(data["source"]), policies, named)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TableError(
            f"manylinux table {path}: expected the schema-1 table written by "
            f"scripts/gen_manylinux_table.py, got {exc!r}"
        ) from None
