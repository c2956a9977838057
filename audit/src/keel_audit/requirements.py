"""A wheel's `torch` requirement and `Requires-Python`, read with a real requirement parser (packaging).

The torch requirement is found by distribution name (`torchvision>=` and `torch-abi-audit>=` are
other distributions); its specifier is compared with the audited floor on a grid of torch releases:
admitting a release below the floor is an error, excluding a release the libraries run on (a pin,
an upper bound or a higher lower bound) is narrower than needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

# torch releases a 2.x stable-ABI library may meet (patch releases included); 3.x makes no promise
_TORCH_GRID = tuple(Version(f"2.{m}.{p}") for m in range(40) for p in range(4))
_PYTHON_GRID = tuple(Version(f"3.{m}") for m in range(40))


@dataclass(frozen=True, slots=True)
class TorchRequirement:
    """The torch requirement of a distribution: the specifier (all torch lines intersected)."""

    text: str
    specifier: SpecifierSet

    def below(self, floor: str) -> Version | None:
        """The highest release below `floor` (X.Y) that the requirement admits, or None."""
        lo = Version(floor)
        admitted = [v for v in _TORCH_GRID if v < lo and self.specifier.contains(v, prereleases=False)]
        return max(admitted, default=None)

    def excluded(self, floor: str) -> list[Version]:
        """Releases >= floor (2.x) that the requirement excludes."""
        lo = Version(floor)
        return [v for v in _TORCH_GRID if v >= lo and not self.specifier.contains(v, prereleases=False)]


def torch_requirement(requires: tuple[str, ...]) -> TorchRequirement | None:
    """The `torch` requirement among Requires-Dist lines (those that apply without extras), or None."""
    found: list[Requirement] = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "torch":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found.append(req)
    if not found:
        return None
    spec = SpecifierSet()
    for req in found:
        spec &= req.specifier
    return TorchRequirement(", ".join(str(r) for r in found), spec)


def python_floor(requires_python: str | None) -> str | None:
    """The lowest Python 3.Y that a Requires-Python specifier admits ("3.11" for ">=3.11,<3.15")."""
    if not requires_python:
        return None
    try:
        spec = SpecifierSet(requires_python)
    except InvalidSpecifier:
        return None
    lowest = next((v for v in _PYTHON_GRID if spec.contains(v, prereleases=True)), None)
    if lowest is None:  # e.g. ">=3.11.2": no bare minor is admitted; take the next patch range
        lowest = next((v for v in _PYTHON_GRID if spec.contains(Version(f"{v}.99"), prereleases=True)), None)
    return None if lowest is None else f"{lowest.major}.{lowest.minor}"
