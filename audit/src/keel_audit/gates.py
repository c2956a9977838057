"""Package-level gates: target torch, stability, allowlist, wheel tags and the torch requirement."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from .inputs import Source
from .manylinux import Needs, manylinux_table
from .requirements import python_floor, torch_requirement
from .result import INVALID, Finding, LibraryAudit
from .versions import highest
from .versions import key as _key

_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def package_findings(
    sources: list[Source],
    by_source: dict[str, list[LibraryAudit]],
    target: str | None,
    allow: tuple[str, ...],
) -> list[Finding]:
    """Findings that need the gate flags or the wheel's tags and metadata."""
    out: list[Finding] = []
    libs = [lib for group in by_source.values() for lib in group]
    for pattern in allow:
        if not any(fnmatch.fnmatch(lib.path, pattern) or fnmatch.fnmatch(Path(lib.path).name, pattern) for lib in libs):
            out.append(
                Finding(
                    "stale-allow",
                    None,
                    f"--allow {pattern!r} matches no library; expected a pattern "
                    "naming a library in the input (remove stale allowlist entries)",
                )
            )
    for lib in libs:
        if lib.verdict == INVALID or target is None:
            continue
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
        out += requirement_findings(source, by_source.get(source.label, []))
    return out


def _tag_findings(source: Source, libs: list[LibraryAudit]) -> list[Finding]:
    """Python floor vs abi3 tag and Requires-Python, glibc and libstdc++/libgcc versions vs manylinux
    tag, ELF machine vs platform tag.

    A limited-API floor above the `cpXY-abi3` tag is fine when Requires-Python already keeps every
    Python below it from installing the wheel (a note); otherwise it is an error.
    """
    out: list[Finding] = []
    abi3_pys = [t.split("-")[0] for t in source.tags if t.split("-")[1] == "abi3" and t.startswith("cp3")]
    tag_py = min((f"3.{p[3:]}" for p in abi3_pys), key=_key, default=None)
    req_py = python_floor(source.requires_python)
    plats = {t.split("-")[2] for t in source.tags}
    for lib in libs:
        if lib.verdict == INVALID:
            continue
        if tag_py and lib.python_floor and _key(lib.python_floor) > _key(tag_py):
            tag = f"cp{tag_py.replace('.', '')}-abi3"
            if req_py and _key(lib.python_floor) <= _key(req_py):
                out.append(
                    Finding(
                        "python-floor-from-requires-python",
                        lib.path,
                        f"needs Python {lib.python_floor} (limited API), above the {tag} tag, but "
                        f"Requires-Python {source.requires_python} admits no older Python",
                    )
                )
            else:
                rp = f" and Requires-Python {source.requires_python}" if source.requires_python else ""
                out.append(
                    Finding(
                        "python-floor-above-tag",
                        lib.path,
                        f"needs Python {lib.python_floor} (limited API) but the wheel is tagged {tag}{rp}; "
                        f"expected a floor <= {max(tag_py, req_py or tag_py, key=_key)}",
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
            if glibc:
                out += _libstdcxx_findings(lib, plat, glibc, arch)
            if arch and lib.machine and arch != lib.machine:
                out.append(
                    Finding(
                        "machine-mismatch",
                        lib.path,
                        f"ELF machine {lib.machine} in a wheel tagged {plat}; expected {arch}",
                    )
                )
    return out


def _libstdcxx_findings(lib: LibraryAudit, plat: str, glibc: tuple[int, int], arch: str | None) -> list[Finding]:
    """GLIBCXX_ / CXXABI_ / GCC_ versions above what the tag's manylinux policy allows.

    The policy is the newest known one at or below the tag's glibc (data/manylinux_policy.json). A
    tag above every known policy is not judged on versions above the newest one: they are reported
    as manylinux-floor-unknown (classify.py), not as an error the table cannot prove.
    """
    table = manylinux_table()
    bound, newest = table.policy_for_tag(arch, glibc), table.newest(arch)
    if bound is None or newest is None or (bound is newest and glibc > _key(newest.glibc)):
        return []
    highest = {f: v for f, v in (("GLIBCXX", lib.glibcxx_max), ("CXXABI", lib.cxxabi_max), ("GCC", lib.gcc_max)) if v}
    want = Needs(highest, tuple(n for n in lib.named_versions if not n.startswith("GLIBC_")))
    named = table.named.get(arch or "", {})
    excess = bound.excess(want, named)
    if not excess:
        return []
    policy = f"manylinux_{bound.glibc.replace('.', '_')}"
    allowed = []
    for version in excess:
        family = version.split("_", 1)[0]
        if version in want.named:
            since = named.get(version)
            allowed.append(
                f"{version} only from manylinux_{since.replace('.', '_')}" if since else f"{version} in no known policy"
            )
        else:
            top = bound.highest.get(family)
            allowed.append(f"{family} at most {family}_{top}" if top else f"no {family}_ version")
    via = "" if _key(bound.glibc) == glibc else f" (the newest known policy at or below the tag is {policy})"
    return [
        Finding(
            "libstdcxx-above-tag",
            lib.path,
            f"needs {', '.join(excess)} but the wheel is tagged {plat}; expected what {policy} allows"
            f"{via}: {'; '.join(allowed)} (manylinux floor {lib.manylinux_floor or 'unknown'})",
            tuple(excess),
        )
    ]


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


def requirement_findings(source: Source, libs: list[LibraryAudit]) -> list[Finding]:
    """The wheel's torch requirement against the audited floor: below it is an error, narrower than
    the range the libraries run on (torch >= floor) a warning, none at all a warning."""
    floor = highest([lib.torch_floor for lib in libs if lib.torch_floor])
    if source.kind not in ("wheel", "distribution") or floor is None:
        return []
    req = torch_requirement(source.requires)
    if req is None:
        return [
            Finding(
                "torch-requirement-missing",
                None,
                f"{source.label}: no torch requirement; expected torch>={floor} (the audited floor)",
            )
        ]
    below = req.below(floor)
    if below is not None:
        return [
            Finding(
                "torch-requirement-below-floor",
                None,
                f"{source.label}: requires {req.text}, which admits torch {below}, but its libraries "
                f"need torch {floor}; expected torch>={floor}",
            )
        ]
    excluded = req.excluded(floor)
    if excluded:
        shown = ", ".join(dict.fromkeys(str(v) for v in (excluded[0], excluded[-1])))
        return [
            Finding(
                "torch-requirement-narrow",
                None,
                f"{source.label}: requires {req.text}, narrower than the range its libraries run on "
                f"(torch>={floor}): excludes torch {shown} among others; expected torch>={floor}",
            )
        ]
    return []
