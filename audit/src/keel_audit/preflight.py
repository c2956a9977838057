"""`keel-audit preflight TARGET --torch CANDIDATE`: will every library of TARGET load on that torch?

Each undefined dynamic symbol of each TARGET library is resolved the way the dynamic loader does
after `import torch`: against the library's own DT_NEEDED tree (breadth first, over TARGET's own
libraries, the candidate's libraries and, for names neither provides, this machine's libraries),
then the global scope torch sets up (`libtorch_global_deps.so` and its tree, loaded RTLD_GLOBAL;
the interpreter's `Py*` symbols). A versioned reference (`name@V` from file F) needs F in the tree
to define `name` at version V; an unversioned one any default definition; a weak one nothing.
Every (F, V) of `.gnu.version_r` needs F to define V (the loader's "version `V' not found").
Symbols versioned to glibc/libstdc++/libgcc (GLIBC_, GLIBCXX_, CXXABI_, GCC_) and the libraries
of that family are the platform's: not checked here (the audit's manylinux floor covers them).

The candidate's libraries are read only when some TARGET library's tree reaches them, level by
level (a deeper level only while symbols are still unresolved), several at once.

Beyond symbols: the CUDA runtime major (DT_NEEDED libcudart.so.N) against the candidate's
(`torch.version.cuda`), and a Python extension's ABI (abi3 floor or exact cpXY) against the
candidate's CPython tag. A library `loads` when nothing it needs is missing; exit 0 when every
library loads (and its Python ABI fits), 1 otherwise, 2 when an input cannot be read.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .analysis import _open, _parse
from .candidate import Provider, TorchCandidate, host_dirs, host_library, open_candidate
from .elf import ElfFormatError, ElfInfo, Symbol, read_elf
from .errors import AuditError, AuditInputError
from .inputs import Source

SCHEMA = "keel-audit-preflight/1"
# the platform: glibc and the GCC runtime (their symbols carry GLIBC_/GLIBCXX_/CXXABI_/GCC_ versions)
SYSTEM_LIBRARIES = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libutil.so.1",
        "libresolv.so.2",
        "libnsl.so.1",
        "libanl.so.1",
        "libmvec.so.1",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
        "ld-linux.so.2",
        "ld64.so.2",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libatomic.so.1",
    }
)
SYSTEM_VERSION_PREFIXES = ("GLIBC_", "GLIBCXX_", "CXXABI_", "GCC_", "CXXABI_TM_", "ATOMIC_")
PYTHON_PREFIXES = ("Py", "_Py")
DRIVER_LIBRARIES = {"libcuda.so.1": "the NVIDIA driver", "libnvidia-ml.so.1": "the NVIDIA driver (NVML)"}
_CUDART = re.compile(r"^libcudart\.so\.(\d+)$")
_CPYTHON_SUFFIX = re.compile(r"\.cpython-3(\d+)[^/]*\.so$")


@dataclass(frozen=True)
class Missing:
    """An undefined symbol nothing in the library's scope defines."""

    symbol: str
    version: str | None
    expected_from: str  # the library (or libraries) it should have come from
    defined_in: str | None = None  # a candidate library that does define it, outside the scope


@dataclass(frozen=True)
class LibraryPreflight:
    """What one TARGET library finds on the candidate."""

    path: str
    loads: bool
    python_ok: bool
    needed: dict[str, str]  # DT_NEEDED entry -> who provides it (torch, cuda, target, system, host, ...)
    unprovided: tuple[tuple[str, str], ...]  # (DT_NEEDED entry, why nobody provides it)
    missing: tuple[Missing, ...]
    missing_versions: tuple[tuple[str, str], ...]  # (file, version) the file does not define
    cuda: dict[str, Any]
    python: dict[str, Any]
    counts: dict[str, int]  # undefined symbols by how they resolved
    unchecked: tuple[str, ...] = ()  # CUDA-library symbols left unchecked (no nvidia-* libraries given)

    @property
    def ok(self) -> bool:
        return self.loads and self.python_ok

    @property
    def verdict(self) -> str:
        if not self.loads:
            return "does not load"
        return "loads" if self.python_ok else "loads, wrong Python ABI"


@dataclass(frozen=True)
class PreflightResult:
    targets: tuple[str, ...]
    candidate: dict[str, Any]
    libraries: tuple[LibraryPreflight, ...]
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        return 0 if all(lib.ok for lib in self.libraries) else 1

    def __bool__(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        libs = []
        for lib in self.libraries:
            d = asdict(lib)
            d["verdict"] = lib.verdict
            d["unprovided"] = [{"name": n, "why": w} for n, w in lib.unprovided]
            d["missing_versions"] = [{"file": f, "version": v} for f, v in lib.missing_versions]
            libs.append(d)
        return {
            "schema": SCHEMA,
            "targets": list(self.targets),
            "candidate": self.candidate,
            "ok": self.exit_code == 0,
            "libraries": libs,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }

    def render(self) -> str:
        c = self.candidate
        out = [
            f"keel-audit preflight: {', '.join(self.targets)}",
            f"  against torch {c['version'] or '(version unknown)'} ({c['label']}; "
            f"{'CUDA ' + c['cuda'] if c['cuda'] else 'CPU-only'}; Python {c['python_tag'] or 'unknown'})",
        ]
        out += [f"  note: {n}" for n in self.notes]
        width = max([len(lib.path) for lib in self.libraries] + [7])
        out.append(f"{'library':<{width}}  {'verdict':<14}  resolved  needs")
        for lib in self.libraries:
            needs = ", ".join(f"{n} ({w})" for n, w in lib.needed.items() if w != "system") or "-"
            resolved = sum(v for k, v in lib.counts.items() if k not in ("missing",))
            out.append(f"{lib.path:<{width}}  {lib.verdict:<14}  {resolved:>8}  {needs}")
            for name, why in lib.unprovided:
                out.append(f"    not provided: {name}: {why}")
            for f, v in lib.missing_versions:
                out.append(f"    version {v} not defined by {f}")
            absent = {n for n, _w in lib.unprovided}
            grouped: dict[str, list[str]] = {}
            for m in lib.missing:
                sym = m.symbol + (f"@{m.version}" if m.version else "")
                if m.expected_from in absent:  # symbols of a library that is not there at all: one line
                    grouped.setdefault(m.expected_from, []).append(sym)
                    continue
                also = f" (defined in {m.defined_in}, which it does not link)" if m.defined_in else ""
                out.append(f"    missing: {sym}  expected from {m.expected_from}{also}")
            for name, syms in grouped.items():
                shown = ", ".join(syms[:4]) + (", ..." if len(syms) > 4 else "")
                out.append(f"    missing: {len(syms)} symbol(s) expected from {name} (not provided): {shown}")
            if lib.unchecked:
                out.append(
                    f"    unchecked: {len(lib.unchecked)} CUDA-library symbols ({', '.join(lib.unchecked[:3])}"
                    f"{', ...' if len(lib.unchecked) > 3 else ''}): give the nvidia-* wheels with --also"
                )
            if lib.cuda.get("note"):
                out.append(f"    CUDA: {lib.cuda['note']}")
            if lib.python.get("note"):
                out.append(f"    Python: {lib.python['note']}")
        good = sum(lib.ok for lib in self.libraries)
        out.append(
            f"{good} of {len(self.libraries)} librar{'y' if len(self.libraries) == 1 else 'ies'} load "
            f"on this torch ({self.seconds:.2f} s)"
        )
        return "\n".join(out)


class _Scope:
    """Where DT_NEEDED names come from: TARGET's libraries, the candidate's, the platform, the host."""

    def __init__(self, target_libs: dict[str, ElfInfo], cand: TorchCandidate, host: bool, assume: Sequence[str]):
        self.target = target_libs
        self.cand = cand
        self.assume = set(assume)
        self.host = host
        self._host: dict[str, Provider | None] = {}
        self._dirs: list[str] | None = None
        self._system: dict[str, _Table | None] = {}

    def system_table(self, name: str) -> _Table | None:
        """A platform library of this machine as a table (for unversioned references to it)."""
        if name not in self._system:
            if self._dirs is None:
                self._dirs = host_dirs()
            found = host_library(name, self._dirs)
            try:
                self._system[name] = _table(name, "system", read_elf(found)) if found else None
            except AuditError:
                self._system[name] = None
        return self._system[name]

    def locate(self, name: str) -> tuple[str, ElfInfo | Provider | None]:
        """(origin, what provides it) for a DT_NEEDED name; origin "" when nothing does."""
        if name in self.target:
            return "target", self.target[name]
        p = self.cand.get(name)
        if p is not None:
            return p.origin, p
        if name in SYSTEM_LIBRARIES:
            return "system", None
        if name in self.assume:
            return "assumed", None
        if self.host:
            if name not in self._host:
                if self._dirs is None:
                    self._dirs = host_dirs()
                found = host_library(name, self._dirs)
                self._host[name] = (
                    Provider(name, str(found), "host", found.stat().st_size, partial(Path, found)) if found else None
                )
            hp = self._host[name]
            if hp is not None:
                return "host", hp
        return "", None


@dataclass
class _Table:
    """One provider's exports as sets (built once)."""

    name: str
    origin: str
    default: frozenset[str]  # names an unversioned reference binds to
    versioned: frozenset[tuple[str, str]]  # (name, version) of every versioned definition
    versions: frozenset[str]  # version names it defines
    needed: tuple[str, ...]


_TABLES: dict[int, _Table] = {}


def _table(name: str, origin: str, info: ElfInfo) -> _Table:
    key = id(info)
    t = _TABLES.get(key)
    if t is None or t.name != name:
        select, _binds, vers = info.defined_extra
        if vers and any(v > 1 for v in memoryview(vers).cast("H")):
            syms = info.defined
            default = frozenset(s.name for s in syms if not s.hidden)
            versioned = frozenset((s.name, s.version) for s in syms if s.version)
            versions = frozenset(v for _n, v in versioned)
        else:
            default, versioned, versions = frozenset(info.defined_names), frozenset(), frozenset()
        t = _Table(name, origin, default, versioned, versions, info.needed)
        _TABLES[key] = t
    return t


def _info(what: ElfInfo | Provider | None) -> ElfInfo | None:
    if what is None:
        return None
    return what if isinstance(what, ElfInfo) else what.info()


def _levels(first: Sequence[str], scope: _Scope, seen: set[str]) -> list[tuple[str, str, ElfInfo | Provider | None]]:
    out = []
    for name in first:
        if name in seen:
            continue
        seen.add(name)
        origin, what = scope.locate(name)
        out.append((name, origin, what))
    return out


def _cuda_major(info: ElfInfo) -> str | None:
    for n in info.needed:
        m = _CUDART.match(n)
        if m:
            return m.group(1)
    return None


def _python_req(path: str, info: ElfInfo, tags: tuple[str, ...]) -> tuple[str | None, tuple[int, int] | None, bool]:
    """(kind "abi3"/"exact"/None, version, is an extension module) of one library."""
    is_ext = any(n.startswith("PyInit_") for n in info.defined_names)
    base = path.rsplit("/", 1)[-1]
    m = _CPYTHON_SUFFIX.search(base)
    if m:
        return "exact", (3, int(m.group(1))), is_ext
    wheel_abi3 = [t for t in tags if t.split("-")[1:2] == ["abi3"]]
    if ".abi3." in base or wheel_abi3:
        floors = [int(t.split("-")[0][3:]) for t in wheel_abi3 if re.fullmatch(r"cp3\d+", t.split("-")[0])]
        return "abi3", ((3, min(floors)) if floors else None), is_ext
    exact = [t.split("-")[0] for t in tags if re.fullmatch(r"cp3\d+", t.split("-")[0]) and t.split("-")[1] != "none"]
    if exact:
        return "exact", (3, int(exact[0][3:])), is_ext
    return None, None, is_ext


# name prefix -> (library family it comes from, kind): the attribution of an unresolved symbol
_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("cublasLt", "libcublasLt", "cuda"),
    ("cublas", "libcublas", "cuda"),
    ("cudnn", "libcudnn", "cuda"),
    ("cuda", "libcudart", "cuda"),
    ("nccl", "libnccl", "cuda"),
    ("nvrtc", "libnvrtc", "cuda"),
    ("cufft", "libcufft", "cuda"),
    ("curand", "libcurand", "cuda"),
    ("cusparse", "libcusparse", "cuda"),
    ("cusolver", "libcusolver", "cuda"),
    ("nvJitLink", "libnvJitLink", "cuda"),
    ("cupti", "libcupti", "cuda"),
    ("nvshmem", "libnvshmem", "cuda"),
    ("cu", "libcuda.so.1", "driver"),  # cuMemMap, cuTensorMapEncodeTiled, ...: the driver API
    ("aoti_torch_", "libtorch", "torch"),
    ("torch_", "libtorch", "torch"),
)


def _family(sym: str) -> tuple[str, str] | None:
    """(library family, kind) an unversioned symbol belongs to by its name, None when unknown."""
    for prefix, lib, kind in _FAMILIES:
        if sym.startswith(prefix) and (kind != "driver" or sym[2:3].isupper()):
            if kind == "cuda" and prefix == "cuda" and not sym[4:5].isupper():
                continue
            return lib, kind
    return None


def _expected(sym: str, direct: list[tuple[str, str]]) -> str:
    """Which library an unresolved unversioned symbol should have come from."""
    names = [n for n, origin in direct if origin != "system"]
    fam = _family(sym)
    if fam is not None:
        linked = [n for n in names if n.startswith(fam[0])]
        if fam[1] == "torch":
            cuda = [n for n in linked if "cuda" in n]
            linked = (cuda if "cuda" in sym else [n for n in linked if "cuda" not in n]) or linked
        return " or ".join(linked) if linked else f"{fam[0]}* (which it does not link)"
    return " or ".join(names) if names else "a library it does not link (no DT_NEEDED names one)"


_PROCESS_LIBRARIES = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0")  # the interpreter's own


def resolve_library(
    path: str, info: ElfInfo, scope: _Scope, global_names: Sequence[str], tags: tuple[str, ...]
) -> LibraryPreflight:
    """One TARGET library against the candidate: its symbols looked up (`_Lookup`), then what is missing
    explained (which library should have provided it, the CUDA runtime, the Python ABI)."""
    cand = scope.cand
    seen: set[str] = set()
    level = _levels(info.needed, scope, seen)
    direct = [(n, o) for n, o, _w in level]
    counts = {"torch": 0, "cuda": 0, "target": 0, "host": 0, "extra": 0, "global": 0, "system": 0, "python": 0}
    counts |= {"weak": 0, "assumed": 0, "missing": 0}
    lookup = _Lookup(scope, info, counts)
    unresolved, missing_versions = lookup.run(level, seen, global_names, direct)
    missing, unchecked = _explain_missing(unresolved, lookup.vneed_file, direct, cand, counts)
    unprovided = [(n, _why_unprovided(n, cand)) for n, o, _w in level if not o]
    python = _python_verdict(path, info, tags, cand)
    return LibraryPreflight(
        path=path,
        loads=not unprovided and not missing and not missing_versions,
        python_ok=bool(python["ok"]),
        needed={n: (o or "not provided") for n, o, _w in level},
        unprovided=tuple(unprovided),
        missing=tuple(missing),
        missing_versions=tuple(missing_versions),
        cuda=_cuda_verdict(info, cand),
        python=python,
        counts={k: v for k, v in counts.items() if v},
        unchecked=tuple(unchecked),
    )


class _Lookup:
    """Where each undefined symbol of one library resolves, as the loader looks: its DT_NEEDED tree level by
    level (a deeper level read only while symbols are still unresolved), then the global scope torch sets up,
    then (with the host) the platform's libraries for unversioned references. Tallies into `counts`."""

    def __init__(self, scope: _Scope, info: ElfInfo, counts: dict[str, int]) -> None:
        self.scope, self.info, self.counts = scope, info, counts
        self.tables: list[_Table] = []
        self.global_tables: list[_Table] = []
        self.version_owner: dict[str, _Table] = {}
        self.vneed_file = {v: f for f, v in info.version_needs}

    def run(
        self,
        level: list[tuple[str, str, ElfInfo | Provider | None]],
        seen: set[str],
        global_names: Sequence[str],
        direct: list[tuple[str, str]],
    ) -> tuple[list[Symbol], list[tuple[str, str]]]:
        """The symbols nothing resolves, and the (file, version) needs a direct dependency does not define."""
        pending = self._add(level)
        glob = _levels(global_names, self.scope, set())
        self.scope.cand.prefetch(n for n, o, w in glob if isinstance(w, Provider))
        self.global_tables = [_table(n, o, i) for n, o, w in glob if (i := _info(w)) is not None]
        unresolved = []
        for s in self.info.undefined:
            file = self.vneed_file.get(s.version or "")
            if s.version and (s.version.startswith(SYSTEM_VERSION_PREFIXES) or file in SYSTEM_LIBRARIES):
                self.counts["system"] += 1
            else:
                unresolved.append(s)
        missing_versions = [
            (f, v)
            for f, v in self.info.version_needs
            if not (f in SYSTEM_LIBRARIES or v.startswith(SYSTEM_VERSION_PREFIXES))
            and (t := self.version_owner.get(f)) is not None
            and v not in t.versions
        ]
        while True:
            left = []
            for s in unresolved:
                t = self._find(s.name, s.version)
                if t is None:
                    left.append(s)
                else:
                    self.counts["global" if t in self.global_tables and t not in self.tables else t.origin] += 1
            unresolved = left
            if not unresolved or not pending:
                break
            pending = self._add(_levels(pending, self.scope, seen))
        if unresolved and self.scope.host:
            unresolved = self._platform(unresolved, direct)
        return unresolved, missing_versions

    def _add(self, lv: list[tuple[str, str, ElfInfo | Provider | None]]) -> list[str]:
        """Read one level of the tree (in parallel); the names of the next."""
        self.scope.cand.prefetch(n for n, o, w in lv if isinstance(w, Provider))
        deeper: list[str] = []
        for n, o, w in lv:
            i = _info(w)
            if i is None:
                continue
            t = _table(n, o, i)
            self.tables.append(t)
            deeper += t.needed
            if i.soname:
                self.version_owner.setdefault(i.soname, t)
            self.version_owner.setdefault(n, t)
        return deeper

    def _find(self, name: str, version: str | None) -> _Table | None:
        if version:
            owner = self.version_owner.get(self.vneed_file.get(version, ""))
            if owner is not None:
                return owner if (name, version) in owner.versioned else None
            return next((t for t in self.tables + self.global_tables if (name, version) in t.versioned), None)
        return next((t for t in self.tables + self.global_tables if name in t.default), None)

    def _platform(self, unresolved: list[Symbol], direct: list[tuple[str, str]]) -> list[Symbol]:
        """Unversioned references glibc or the GCC runtime answer (dlopen, ...)."""
        system = [n for n, o in direct if o == "system"] + list(_PROCESS_LIBRARIES)
        sys_tables = [t for n in dict.fromkeys(system) if (t := self.scope.system_table(n)) is not None]
        left = []
        for s in unresolved:
            if not s.version and any(s.name in t.default for t in sys_tables):
                self.counts["system"] += 1
            else:
                left.append(s)
        return left


def _why_unprovided(name: str, cand: TorchCandidate) -> str:
    """Why nobody provides DT_NEEDED entry `name`."""
    if name in DRIVER_LIBRARIES:
        return f"{DRIVER_LIBRARIES[name]}'s library; not part of torch and not found on this machine"
    cudart = _CUDART.match(name)
    if cudart:
        have = [p for p in cand.providers if _CUDART.match(p)]
        return (
            f"CUDA runtime {cudart.group(1)}; the candidate is "
            + (f"CUDA {cand.cuda}" if cand.cuda else "CPU-only")
            + (f" and provides {', '.join(have)}" if have else "")
        )
    if any(name.startswith(lib) for _p, lib, kind in _FAMILIES if kind == "cuda"):
        given = "" if cand.cuda_libraries_given else " (its nvidia-* wheels were not given: --also)"
        return f"a CUDA library: not in the candidate{given} nor on this machine"
    if name.startswith(("libtorch", "libc10")):
        return "not in this torch" + ("" if cand.cuda else " (a CPU-only build)")
    return "neither in the candidate nor in the target nor on this machine"


def _explain_missing(
    unresolved: list[Symbol],
    vneed_file: dict[str, str],
    direct: list[tuple[str, str]],
    cand: TorchCandidate,
    counts: dict[str, int],
) -> tuple[list[Missing], list[str]]:
    """The unresolved symbols that do stop the library from loading, each with the library it should have come
    from (and a candidate library that defines it elsewhere); weak, Python, assumed and unchecked CUDA symbols
    are tallied in `counts` instead. Also the CUDA symbols left unchecked."""
    missing: list[Missing] = []
    unchecked: list[str] = []
    assumed_files = {n for n, o in direct if o == "assumed"}
    for s in unresolved:
        vfile = vneed_file.get(s.version or "")
        fam = _family(s.name) if not s.version else None
        if s.binding == "weak":
            counts["weak"] += 1
        elif not s.version and s.name.startswith(PYTHON_PREFIXES):
            counts["python"] += 1
        elif vfile in assumed_files or (fam is not None and any(a.startswith(fam[0]) for a in assumed_files)):
            counts["assumed"] += 1
        elif fam is not None and fam[1] == "cuda" and not cand.cuda_libraries_given:
            counts["unchecked"] = counts.get("unchecked", 0) + 1
            unchecked.append(s.name)
        else:
            counts["missing"] += 1
            elsewhere = next(
                (
                    p.name
                    for p in cand.providers.values()
                    if p.loaded and s.name in _table(p.name, p.origin, p.info()).default
                ),
                None,
            )
            missing.append(Missing(s.name, s.version, vfile or _expected(s.name, direct), elsewhere))
    return missing, unchecked


def _cuda_verdict(info: ElfInfo, cand: TorchCandidate) -> dict[str, Any]:
    """The CUDA runtime the library links (DT_NEEDED libcudart.so.N, or static) against the candidate's."""
    major = _cuda_major(info)
    cand_major = cand.cuda.split(".")[0] if cand.cuda else None
    uses_cuda = major is not None or any(
        n in ("libtorch_cuda.so", "libc10_cuda.so", "libcuda.so.1") for n in info.needed
    )
    cuda: dict[str, Any] = {"target": major, "candidate": cand_major, "ok": True, "note": ""}
    if major and cand_major and major != cand_major:
        cuda["ok"] = False
        cuda["note"] = (
            f"links the CUDA {major} runtime (libcudart.so.{major}); this torch is built for CUDA {cand.cuda}"
        )
    elif uses_cuda and not cand_major:
        cuda["ok"] = False
        cuda["note"] = "a CUDA library; this torch is a CPU-only build"
    elif uses_cuda and major is None:  # cand_major is set here: the branch above took CPU-only builds
        cuda["target"] = "static"
        cuda["note"] = f"links the CUDA runtime statically; this torch is built for CUDA {cand.cuda}"
    return cuda


def _python_verdict(path: str, info: ElfInfo, tags: tuple[str, ...], cand: TorchCandidate) -> dict[str, Any]:
    """A Python extension's ABI (abi3 floor or exact cpXY) against the candidate's CPython tag."""
    kind, pyver, is_ext = _python_req(path, info, tags)
    cand_py = (3, int(cand.python_tag[3:])) if cand.python_tag else None
    python: dict[str, Any] = {"extension": is_ext, "kind": kind, "ok": True, "note": ""}
    python["target"] = f"cp{pyver[0]}{pyver[1]}" if pyver else None
    python["candidate"] = cand.python_tag
    if is_ext and kind and pyver and cand_py:
        if (kind == "abi3" and cand_py < pyver) or (kind == "exact" and cand_py != pyver):
            python["ok"] = False
            python["note"] = (
                f"{'abi3 from' if kind == 'abi3' else 'built for'} Python {pyver[0]}.{pyver[1]}; "
                f"this torch is for Python {cand_py[0]}.{cand_py[1]}"
            )
    return python


def _read_overlapped(sources: list[Source], cand: TorchCandidate) -> list[tuple[Source, str, ElfInfo | ElfFormatError]]:
    """Parse every TARGET library (largest first) and, as soon as one is parsed, start reading the
    candidate libraries its DT_NEEDED names, in the same pool: the candidate's big libraries
    (libtorch_cuda.so inflates to about 1 GB) start while the rest of TARGET is still being read."""
    work = [(source, c) for source in sources for c in source.candidates]
    order = sorted(range(len(work)), key=lambda k: -work[k][1].size)
    lock = threading.Lock()
    started: set[str] = set()
    extra: list[Future[ElfInfo]] = []
    with ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, 8))) as pool:

        def follow(fut: Future[ElfInfo | ElfFormatError]) -> None:
            info = fut.result() if not fut.exception() else None
            if not isinstance(info, ElfInfo):
                return
            with lock:
                for name in info.needed:
                    p = cand.get(name)
                    if p is not None and name not in started:
                        started.add(name)
                        extra.append(pool.submit(p.info))

        futures: dict[int, Future[ElfInfo | ElfFormatError]] = {}
        for k in order:
            futures[k] = pool.submit(_parse, *work[k])
            futures[k].add_done_callback(follow)
        parsed = [futures[k].result() for k in range(len(work))]
    for f in extra:
        f.result()  # raises the candidate library's read error, if any
    return [(source, c.path, info) for (source, c), info in zip(work, parsed, strict=True)]


def preflight(
    targets: Sequence[str],
    torch: str,
    *,
    also: Sequence[str] = (),
    host: bool = True,
    assume: Sequence[str] = (),
    cache: Path | None = None,
) -> PreflightResult:
    """Resolve every library of `targets` against the candidate torch `torch` (see the module doc)."""
    t0 = time.perf_counter()
    if not targets:
        raise AuditInputError("preflight: expected at least one TARGET (a .whl, a folder, .so files or a distribution)")
    with ExitStack() as stack:
        cand = open_candidate(torch, stack, also, cache)
        sources = [_open(arg, stack) for arg in targets]
        loaded = _read_overlapped(sources, cand)
        bad = [(src.label, p, i) for src, p, i in loaded if isinstance(i, ElfFormatError)]
        if bad:
            label, p, err = bad[0]
            raise AuditInputError(f"{label}: {p}: not a readable ELF shared object ({err})")
        target_libs: dict[str, ElfInfo] = {}
        for _src, p, i in loaded:
            assert isinstance(i, ElfInfo)
            target_libs.setdefault(p.rsplit("/", 1)[-1], i)
            if i.soname:
                target_libs.setdefault(i.soname, i)
        scope = _Scope(target_libs, cand, host, assume)
        global_names: list[str] = []
        gd = cand.get("libtorch_global_deps.so")
        if gd is not None:
            global_names = ["libtorch_global_deps.so", *gd.info().needed]
        cand.prefetch(global_names)
        libs = [resolve_library(p, i, scope, global_names, src.tags) for src, p, i in loaded if isinstance(i, ElfInfo)]
        notes = []
        if cand.cuda and not cand.cuda_libraries_given:
            notes.append(
                f"the CUDA {cand.cuda} runtime libraries (nvidia-* wheels) were not given (--also): "
                "DT_NEEDED entries and symbols they would provide are looked for on this machine only"
            )
        info = {
            "label": cand.label,
            "version": cand.version,
            "cuda": cand.cuda,
            "python_tag": cand.python_tag,
            "libraries_read": sorted(p.name for p in cand.providers.values() if p.loaded),
            "cuda_libraries_given": cand.cuda_libraries_given,
        }
    _TABLES.clear()
    return PreflightResult(tuple(s.label for s in sources), info, tuple(libs), time.perf_counter() - t0, tuple(notes))
