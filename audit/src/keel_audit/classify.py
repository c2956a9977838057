"""Classify one library's symbols: stable shim, unstable libtorch C++, CPython, CUDA runtime, other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from .elf import ElfInfo
from .mangling import is_stable_path, torch_refs
from .manylinux import manylinux_table, needs
from .policy import Policy
from .result import NO_TORCH, STABLE, UNSTABLE, Finding, LibraryAudit
from .symbol_tables import CPythonTable, ShimTable, is_cpython_name
from .versions import highest


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a library is judged against, shared across the package."""

    shims: ShimTable
    cpython: CPythonTable
    policy: Policy
    package_exports: frozenset[str]
    abi3_wheel: bool
    oldest_torch: str = "2.10"  # imports count as header-only only if they were so in this torch
    categories: dict[str, int] = field(default_factory=dict)  # undefined name -> category
    exported: dict[str, int] = field(default_factory=dict)  # defined name -> torch_use()


# what a C++ name involves of torch (memoised per audit in Context.exported)
NO_TORCH_USE, HEADER_ONLY, UNSTABLE_USE = 0, 1, 2


def torch_use(name: str, shims: ShimTable, upto: str | None = None) -> int:
    """UNSTABLE_USE when a mangled name involves a torch name that is not header-only (`at::Tensor`,
    `c10::intrusive_ptr`, `c10::IValue`, ...), HEADER_ONLY when every torch name it involves is
    header-only (`c10::BFloat16`, `c10::toString`, `torch::stable::Tensor`, ...), else NO_TORCH_USE.

    An operator in a torch namespace (`c10::operator+`) is decided by the names around it; alone it
    counts as unstable. With `upto`, a name counts as header-only only when it already was in torch
    `upto` (for imports: an older torch's libc10 may export what is header-only today).
    """
    refs = torch_refs(name)
    if not refs:
        return NO_TORCH_USE
    header_only = False
    for path in refs:
        if is_stable_path(path) or shims.is_header_only(path, upto):
            header_only = True
        elif not (path.count("::") == 1 and path.endswith("::operator")):
            return UNSTABLE_USE
    return HEADER_ONLY if header_only else UNSTABLE_USE


# symbol categories for undefined names (memoised per audit in Context.categories)
SHIM, SHIM_EXPORTED, UNKNOWN, UNSTABLE_REF, LIMITED, NONLIMITED, OTHER, HEADER_ONLY_REF = range(8)


def _category(name: str, ctx: Context) -> int:
    """Which bucket an undefined name falls in; the order of the tests is the classification rule.

    An undefined name that involves only header-only torch names is no libtorch import when another
    library of the package defines it; otherwise it binds to whatever copy the process has loaded
    (HEADER_ONLY_REF, a policy question, not an unstable import).
    """
    if name in ctx.shims.symbols:
        return SHIM
    if ctx.policy.is_shim_like(name):
        return SHIM_EXPORTED if name in ctx.package_exports else UNKNOWN
    if name.startswith("_Z"):
        use = torch_use(name, ctx.shims, ctx.oldest_torch)
        if use == UNSTABLE_USE:
            return UNSTABLE_REF
        return HEADER_ONLY_REF if use == HEADER_ONLY and name not in ctx.package_exports else OTHER
    if name in ctx.shims.python_globals or ctx.policy.is_python_global(name):
        return UNSTABLE_REF
    if is_cpython_name(name):
        return LIMITED if name in ctx.cpython.symbols else NONLIMITED
    return OTHER


def _lookup(names: tuple[str, ...], memo: dict[str, int], compute: Callable[[str], int]) -> list[int]:
    """`compute(name)` for every name, through a per-audit memo (a dict lookup per repeated name)."""
    got = list(map(memo.get, names))
    if None in got:
        for i, name in enumerate(names):
            if got[i] is None:
                got[i] = memo[name] = compute(name)
    return cast(list[int], got)  # no None left


def classify(path: str, info: ElfInfo, ctx: Context) -> tuple[LibraryAudit, list[Finding]]:
    """One LibraryAudit plus the findings that follow from the library alone."""
    names = info.undefined_names
    buckets: tuple[list[str], ...] = ([], [], [], [], [], [], [], [])
    for name, cat in zip(names, _lookup(names, ctx.categories, lambda n: _category(n, ctx)), strict=True):
        buckets[cat].append(name)
    shims = {n: ctx.shims.symbols[n] for n in buckets[SHIM]}
    unknown, unstable_undef, nonlimited = buckets[UNKNOWN], buckets[UNSTABLE_REF], buckets[NONLIMITED]
    limited = {n: ctx.cpython.symbols[n] for n in buckets[LIMITED]}
    other = len(buckets[OTHER])
    defined = info.defined_names
    uses = _lookup(defined, ctx.exported, lambda n: torch_use(n, ctx.shims))
    exported = [n for n, u in zip(defined, uses, strict=True) if u == UNSTABLE_USE]
    header_only = [n for n, u in zip(defined, uses, strict=True) if u == HEADER_ONLY]
    floor = highest(sorted(set(shims.values())))
    # the abi3 floor only means something when every CPython symbol is in the limited API
    py_floor = None if nonlimited else highest(sorted(set(limited.values())))
    abi3 = ".abi3." in path.rsplit("/", 1)[-1] or ctx.abi3_wheel
    vers = needs(info, loader=True).highest  # every needed file, the loader included
    machine = ctx.policy.machines.get(info.machine, info.machine)
    platform_needs = needs(info)
    manylinux_floor, excess = manylinux_table().floor(machine, platform_needs)
    verdict = UNSTABLE if (unstable_undef or exported or unknown) else STABLE if shims else NO_TORCH
    lib = LibraryAudit(
        path=path,
        verdict=verdict,
        machine=machine,
        needed=info.needed,
        runpath=info.rpath + info.runpath,
        torch_floor=floor,
        floor_symbols=tuple(sorted(n for n, v in shims.items() if v == floor)),
        python_floor=py_floor,
        abi3=abi3,
        glibc_max=vers.get("GLIBC"),
        glibcxx_max=vers.get("GLIBCXX"),
        cxxabi_max=vers.get("CXXABI"),
        gcc_max=vers.get("GCC"),
        manylinux_floor=manylinux_floor,
        manylinux_excess=tuple(excess),
        named_versions=platform_needs.named,
        shim_symbols=tuple(sorted(shims.items())),
        unknown_shim=tuple(sorted(unknown)),
        unstable_undefined=tuple(unstable_undef),
        unstable_exported=tuple(exported),
        header_only_exported=tuple(header_only),
        header_only_imported=tuple(buckets[HEADER_ONLY_REF]),
        cpython_limited=len(limited),
        cpython_nonlimited=tuple(sorted(nonlimited)),
        other=other,
    )
    return lib, _library_findings(lib, ctx)


def _library_findings(lib: LibraryAudit, ctx: Context) -> list[Finding]:
    """Findings that need only the library: unstable use, linkage, unknown shims, CPython, header-only.

    Severities are left to the policy (analysis.py), except a non-limited CPython symbol outside an
    abi3 library, which is a note.
    """
    return [*_torch_symbol_findings(lib, ctx), *_linkage_findings(lib, ctx), *_platform_findings(lib)]


def _torch_symbol_findings(lib: LibraryAudit, ctx: Context) -> list[Finding]:
    """Unstable libtorch C++ and torch C symbols the shim table does not know."""
    out: list[Finding] = []
    p = lib.path
    if lib.unstable_symbols:
        out.append(
            Finding(
                "unstable",
                p,
                f"uses unstable libtorch C++: {len(lib.unstable_undefined)} import(s) from libtorch, "
                f"{len(lib.unstable_exported)} definition(s) that compile in a libtorch type's layout; "
                "expected only stable shim symbols and header-only torch types",
                lib.unstable_symbols[:20],
            )
        )
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
    return out


def _linkage_findings(lib: LibraryAudit, ctx: Context) -> list[Finding]:
    """DT_NEEDED torch libraries (forbidden or unneeded), a dynamic CUDA runtime, a RUNPATH into the build."""
    out: list[Finding] = []
    p = lib.path
    torch_needed = [n for n in lib.needed if ctx.policy.is_torch_library(n)]
    bad = tuple(n for n in torch_needed if ctx.policy.forbidden_torch_library(n))
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
    unneeded = tuple(n for n in _unneeded(lib, ctx) if n not in bad)
    if unneeded:
        out.append(
            Finding(
                "unneeded-torch-library",
                p,
                f"DT_NEEDED {', '.join(unneeded)} provides none of the symbols this library uses "
                "(the stable shim is exported by libtorch_cpu.so / libtorch_cuda.so); expected it dropped",
                unneeded,
            )
        )
    cudart = tuple(n for n in lib.needed if ctx.policy.is_cudart(n))
    if cudart:
        out.append(
            Finding(
                "dynamic-cudart",
                p,
                f"DT_NEEDED {', '.join(cudart)}: CUDA runtime linked dynamically (pins the CUDA major "
                "version of the serving image); expected static cudart (-cudart static)",
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
    return out


def _platform_findings(lib: LibraryAudit) -> list[Finding]:
    """CPython outside the limited API, no known manylinux floor, header-only torch code exported or imported."""
    out: list[Finding] = []
    p = lib.path
    if lib.cpython_nonlimited:
        out.append(
            Finding(
                "cpython-non-limited",
                p,
                f"{len(lib.cpython_nonlimited)} CPython symbol(s) outside the "
                f"limited API{' in an abi3 library' if lib.abi3 else ''}; expected limited-API symbols only",
                lib.cpython_nonlimited,
                severity="" if lib.abi3 else "note",
            )
        )
    if lib.manylinux_excess:
        out.append(_floor_unknown(lib))
    if lib.header_only_exported:
        out.append(
            Finding(
                "header-only-export",
                p,
                f"exports {len(lib.header_only_exported)} definition(s) of header-only torch code "
                "(weak/unique instantiations; no ABI dependency, but visible to the whole process); "
                "expected hidden visibility",
                lib.header_only_exported[:20],
            )
        )
    if lib.header_only_imported:
        out.append(
            Finding(
                "header-only-import",
                p,
                f"{len(lib.header_only_imported)} undefined symbol(s) of header-only torch code that no "
                "library of the package defines; they bind to whatever copy the process loaded",
                lib.header_only_imported[:20],
            )
        )
    return out


def _floor_unknown(lib: LibraryAudit) -> Finding:
    """No manylinux floor although the library needs platform symbol versions: one above every
    policy known (data/manylinux_policy.json), or an architecture with no policy. Never a guess."""
    table = manylinux_table()
    newest = table.newest(lib.machine)
    if newest is None:
        why = f"needs {', '.join(lib.manylinux_excess)}; no manylinux policy known for architecture {lib.machine}"
    else:
        why = (
            f"needs {', '.join(lib.manylinux_excess)}, above every manylinux policy known for "
            f"{lib.machine} (newest manylinux_{newest.glibc.replace('.', '_')}, from {table.source})"
        )
    return Finding(
        "manylinux-floor-unknown",
        lib.path,
        f"{why}; no manylinux floor (auditwheel would tag it linux_*); expected versions admitted by a "
        "known policy (regenerate data/manylinux_policy.json from a newer auditwheel if it has one)",
        lib.manylinux_excess,
    )


def _unneeded(lib: LibraryAudit, ctx: Context) -> list[str]:
    """Torch libraries in DT_NEEDED that provide none of the symbols a library without unstable
    imports uses (the shim table knows which torch library exports each shim symbol)."""
    if lib.unstable_undefined:
        return []  # it imports libtorch C++: any torch library may provide it
    providers = {ctx.shims.libraries.get(n) for n, _ in lib.shim_symbols}
    if None in providers:  # a shim symbol whose exporting library the table does not know
        providers |= set(ctx.policy.allowed_torch_libraries) & {"libtorch_cpu.so", "libtorch_cuda.so"}
    return [n for n in lib.needed if ctx.policy.is_torch_library(n) and n not in providers]
