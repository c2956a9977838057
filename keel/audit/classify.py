"""Classify one library's symbols: stable shim, unstable libtorch C++, CPython, CUDA runtime, other."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress

from .elf import ElfInfo
from .mangling import mentions_torch, unstable_torch_namespace
from .models import NO_TORCH, STABLE, UNSTABLE, Finding, LibraryAudit
from .policy import Policy
from .table import CPythonTable, ShimTable, is_cpython_name
from .versions import highest

_GLIBC = re.compile(r"^(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)$")


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a library is judged against, shared across the package."""

    shims: ShimTable
    cpython: CPythonTable
    policy: Policy
    package_exports: frozenset[str]
    abi3_wheel: bool
    categories: dict[str, object] = field(default_factory=dict)  # undefined name -> category
    exported: dict[str, object] = field(default_factory=dict)  # defined name -> unstable torch C++?


def _key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def symbol_versions(info: ElfInfo) -> dict[str, str | None]:
    """Highest GLIBC_, GLIBCXX_ and CXXABI_ version the library needs."""
    found: dict[str, list[str]] = {"GLIBC": [], "GLIBCXX": [], "CXXABI": []}
    for _file, name in info.version_needs:
        m = _GLIBC.match(name)
        if m:
            found[m.group(1)].append(m.group(2))
    return {k: highest(v) for k, v in found.items()}


# symbol categories for undefined names (memoised per audit in Context.categories)
SHIM, SHIM_EXPORTED, UNKNOWN, UNSTABLE_REF, LIMITED, NONLIMITED, OTHER = range(7)


def _category(name: str, ctx: Context) -> int:
    """Which bucket an undefined name falls in; the order of the tests is the classification rule."""
    if name in ctx.shims.symbols:
        return SHIM
    if ctx.policy.is_shim_like(name):
        return SHIM_EXPORTED if name in ctx.package_exports else UNKNOWN
    if name.startswith("_Z"):
        return UNSTABLE_REF if unstable_torch_namespace(name) else OTHER
    if name in ctx.shims.python_globals or ctx.policy.is_python_global(name):
        return UNSTABLE_REF
    if is_cpython_name(name):
        return LIMITED if name in ctx.cpython.symbols else NONLIMITED
    return OTHER


def _unstable_export(name: str) -> bool:
    """An exported definition that interposes unstable torch C++ (weak c10:: instantiations, ...)."""
    return mentions_torch(name) and unstable_torch_namespace(name) is not None


def _lookup(names: tuple[str, ...], memo: dict[str, object], compute: Callable[[str], object]) -> list:
    """`compute(name)` for every name, through a per-audit memo (a dict lookup per repeated name)."""
    got = list(map(memo.get, names))
    if None in got:
        for i, name in enumerate(names):
            if got[i] is None:
                got[i] = memo[name] = compute(name)
    return got


def classify(path: str, info: ElfInfo, ctx: Context) -> tuple[LibraryAudit, list[Finding]]:
    """One LibraryAudit plus the findings that follow from the library alone."""
    names = info.undefined_names
    buckets: tuple[list[str], ...] = ([], [], [], [], [], [], [])
    for name, cat in zip(names, _lookup(names, ctx.categories, lambda n: _category(n, ctx)), strict=True):
        buckets[cat].append(name)
    shims = {n: ctx.shims.symbols[n] for n in buckets[SHIM]}
    unknown, unstable_undef, nonlimited = buckets[UNKNOWN], buckets[UNSTABLE_REF], buckets[NONLIMITED]
    limited = {n: ctx.cpython.symbols[n] for n in buckets[LIMITED]}
    other = len(buckets[OTHER])
    defined = info.defined_names
    exported = list(compress(defined, _lookup(defined, ctx.exported, _unstable_export)))
    floor = highest(sorted(set(shims.values())))
    # the abi3 floor only means something when every CPython symbol is in the limited API
    py_floor = None if nonlimited else highest(sorted(set(limited.values())))
    abi3 = ".abi3." in path.rsplit("/", 1)[-1] or ctx.abi3_wheel
    vers = symbol_versions(info)
    verdict = UNSTABLE if (unstable_undef or exported or unknown) else STABLE if shims else NO_TORCH
    lib = LibraryAudit(
        path=path,
        verdict=verdict,
        machine=ctx.policy.machines.get(info.machine, info.machine),
        needed=info.needed,
        runpath=info.rpath + info.runpath,
        torch_floor=floor,
        floor_symbols=tuple(sorted(n for n, v in shims.items() if v == floor)),
        python_floor=py_floor,
        abi3=abi3,
        glibc_max=vers["GLIBC"],
        glibcxx_max=vers["GLIBCXX"],
        cxxabi_max=vers["CXXABI"],
        shim_symbols=tuple(sorted(shims.items())),
        unknown_shim=tuple(sorted(unknown)),
        unstable_undefined=tuple(unstable_undef),
        unstable_exported=tuple(exported),
        cpython_limited=len(limited),
        cpython_nonlimited=tuple(sorted(nonlimited)),
        other=other,
    )
    return lib, _library_findings(lib, ctx)


def _library_findings(lib: LibraryAudit, ctx: Context) -> list[Finding]:
    """Findings that need only the library: linkage policy, unknown shims, non-limited CPython."""
    out: list[Finding] = []
    p = lib.path
    if lib.unknown_shim:
        out.append(
            Finding(
                "unknown-shim",
                p,
                f"{len(lib.unknown_shim)} torch C symbol(s) not in the stable shim "
                f"table (torch {', '.join(ctx.shims.torch_versions)}); expected only known shim symbols",
                lib.unknown_shim,
            )
        )
    bad = tuple(n for n in lib.needed if ctx.policy.forbidden_torch_library(n))
    if bad:
        out.append(
            Finding(
                "needed-torch-library",
                p,
                f"DT_NEEDED {', '.join(bad)}; expected only "
                f"{' / '.join(ctx.policy.allowed_torch_libraries)} among torch libraries",
                bad,
            )
        )
    cudart = tuple(n for n in lib.needed if ctx.policy.is_cudart(n))
    if cudart:
        out.append(
            Finding(
                "dynamic-cudart",
                p,
                f"DT_NEEDED {', '.join(cudart)}: CUDA runtime linked dynamically; "
                "expected static cudart (-cudart static)",
                cudart,
            )
        )
    build = tuple(r for r in lib.runpath if not r.startswith(("$ORIGIN", "${ORIGIN}")))
    if build:
        out.append(
            Finding(
                "build-tree-runpath",
                p,
                f"RPATH/RUNPATH {':'.join(build)}; expected only "
                "$ORIGIN-relative entries (no paths into the build machine)",
                build,
            )
        )
    if lib.cpython_nonlimited:
        out.append(
            Finding(
                "cpython-non-limited",
                p,
                f"{len(lib.cpython_nonlimited)} CPython symbol(s) outside the "
                f"limited API{' in an abi3 library' if lib.abi3 else ''}; expected limited-API symbols only",
                lib.cpython_nonlimited,
                fatal=lib.abi3,
            )
        )
    return out
