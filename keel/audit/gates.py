"""Package-level gates: target torch, stability, allowlist, wheel tags and the torch requirement."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from .inputs import Source
from .models import INVALID, UNSTABLE, Finding, LibraryAudit
from .versions import highest

_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_TORCH_REQ = re.compile(r"^torch\s*(\[[^\]]*\])?\s*\(?([^;)]*)\)?\s*(;.*)?$", re.IGNORECASE)


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def package_findings(
    sources: list[Source],
    by_source: dict[str, list[LibraryAudit]],
    target: str | None,
    allow: tuple[str, ...],
    require_stable: bool,
) -> list[Finding]:
    """Findings that need the gate flags or the wheel's tags and metadata."""
    out: list[Finding] = []
    libs = [lib for group in by_source.values() for lib in group]
    for pattern in allow:
        if not any(
            fnmatch.fnmatch(lib.path, pattern) or fnmatch.fnmatch(Path(lib.path).name, pattern)
            for lib in libs
        ):
            out.append(
                Finding(
                    "stale-allow",
                    None,
                    f"--allow {pattern!r} matches no library; expected a pattern "
                    "naming a library in the input (remove stale allowlist entries)",
                )
            )
    for lib in libs:
        if lib.verdict == INVALID:
            continue
        if lib.verdict == UNSTABLE:
            gated = (require_stable or target is not None) and not lib.allowed
            why = "allowed by --allow" if lib.allowed else "gated" if gated else "not gated"
            out.append(
                Finding(
                    "unstable",
                    lib.path,
                    f"uses unstable libtorch API ({why}): "
                    f"{len(lib.unstable_symbols)} C++/THP symbol(s), {len(lib.unknown_shim)} unknown; "
                    "expected only stable shim symbols",
                    lib.unstable_symbols[:20],
                    fatal=gated,
                )
            )
        if target is not None:
            newer = tuple(n for n, v in lib.shim_symbols if _key(v) > _key(target))
            if newer:
                out.append(
                    Finding(
                        "shim-newer-than-target",
                        lib.path,
                        f"{len(newer)} shim symbol(s) newer than "
                        f"--target-torch {target} (floor {lib.torch_floor}); expected all <= {target}",
                        newer,
                    )
                )
    for source in sources:
        out += _tag_findings(source, by_source.get(source.label, []))
        out += _requirement_findings(source, by_source.get(source.label, []))
    return out


def _tag_findings(source: Source, libs: list[LibraryAudit]) -> list[Finding]:
    """Python floor vs abi3 tag, glibc vs manylinux tag, ELF machine vs platform tag."""
    out: list[Finding] = []
    abi3_pys = [t.split("-")[0] for t in source.tags if t.split("-")[1] == "abi3" and t.startswith("cp3")]
    tag_py = min((f"3.{p[3:]}" for p in abi3_pys), key=_key, default=None)
    plats = {t.split("-")[2] for t in source.tags}
    for lib in libs:
        if lib.verdict == INVALID:
            continue
        if tag_py and lib.python_floor and _key(lib.python_floor) > _key(tag_py):
            out.append(
                Finding(
                    "python-floor-above-tag",
                    lib.path,
                    f"needs Python {lib.python_floor} "
                    f"(limited API) but the wheel is tagged cp{tag_py.replace('.', '')}-abi3; "
                    f"expected a floor <= {tag_py}",
                )
            )
        for plat in sorted(plats):
            glibc, arch = _platform(plat)
            if glibc and lib.glibc_max and _key(lib.glibc_max) > glibc:
                out.append(
                    Finding(
                        "glibc-above-tag",
                        lib.path,
                        f"needs GLIBC_{lib.glibc_max} but the wheel is tagged "
                        f"{plat}; expected at most glibc {glibc[0]}.{glibc[1]}",
                    )
                )
            if arch and lib.machine and arch != lib.machine:
                out.append(
                    Finding(
                        "machine-mismatch",
                        lib.path,
                        f"ELF machine {lib.machine} in a wheel tagged {plat}; expected {arch}",
                    )
                )
    return out


def _platform(plat: str) -> tuple[tuple[int, int] | None, str | None]:
    """(glibc from a manylinux tag, architecture) of a platform tag; None where it says nothing."""
    m = re.match(r"^manylinux_(\d+)_(\d+)_(\w+)$", plat)
    if m:
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    for legacy, glibc in _LEGACY_MANYLINUX.items():
        if plat.startswith(legacy + "_"):
            return glibc, plat[len(legacy) + 1 :]
    if plat.startswith("linux_"):
        return None, plat[len("linux_") :]
    return None, None


def torch_lower_bound(requires: tuple[str, ...]) -> tuple[bool, str | None]:
    """(torch is required, its `>=` lower bound) from Requires-Dist lines."""
    for req in requires:
        m = _TORCH_REQ.match(req.strip())
        if m:
            bounds = re.findall(r">=\s*([\d.]+)", m.group(2))
            return True, highest([".".join(b.split(".")[:2]) for b in bounds])
    return False, None


def _requirement_findings(source: Source, libs: list[LibraryAudit]) -> list[Finding]:
    """The wheel's torch>= requirement must equal the audited floor (lower is unsafe)."""
    floor = highest([lib.torch_floor for lib in libs if lib.torch_floor])
    if source.kind not in ("wheel", "distribution") or floor is None:
        return []
    required, bound = torch_lower_bound(source.requires)
    if not required or bound is None:
        return [
            Finding(
                "torch-requirement",
                None,
                f"{source.label}: no torch>= requirement; expected torch>={floor} (the audited floor)",
                fatal=False,
            )
        ]
    if _key(bound) < _key(floor):
        return [
            Finding(
                "torch-requirement",
                None,
                f"{source.label}: requires torch>={bound} but its libraries "
                f"need torch {floor}; expected torch>={floor}",
            )
        ]
    if _key(bound) > _key(floor):
        return [
            Finding(
                "torch-requirement",
                None,
                f"{source.label}: requires torch>={bound}, the audited floor "
                f"is {floor}; expected them to be equal",
                fatal=False,
            )
        ]
    return []
