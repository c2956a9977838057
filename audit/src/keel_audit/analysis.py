"""Audit a whole input: read every ELF object, classify it, apply the gates, return a PackageAudit."""

from __future__ import annotations

import fnmatch
import os
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from .classify import Context, classify
from .elf import ElfFormatError, ElfInfo, read_elf
from .errors import AuditInputError
from .gates import package_findings
from .inputs import Candidate, Source, open_distribution, open_path, open_wheel
from .policy import POLICY_FILE, STRICT_FILE, Policy, load_policy
from .result import INVALID, NO_TORCH, STABLE, UNSTABLE, Finding, LibraryAudit, PackageAudit
from .symbol_tables import cpython_table, shim_table
from .versions import fmt, highest, minor, parse

# (source, path in source, parsed ELF or the reason it is not one)
_Loaded = tuple[Source, str, "ElfInfo | ElfFormatError"]


def _open(arg: str, stack: ExitStack) -> Source:
    """Open one input argument as a wheel, directory, file or installed distribution."""
    path = Path(arg)
    if path.is_file() and zipfile.is_zipfile(path) and path.suffix in (".whl", ".zip"):
        try:
            zf = stack.enter_context(zipfile.ZipFile(path))
            fd = os.open(path, os.O_RDONLY)  # positional reads, shared by the reading threads
        except (zipfile.BadZipFile, OSError) as exc:
            raise AuditInputError(f"{path}: not a readable wheel ({exc}); expected a zip archive") from None
        stack.callback(os.close, fd)
        return open_wheel(path, zf, fd)
    if path.suffix == ".whl" and path.is_file():
        raise AuditInputError(f"{path}: not a zip archive; expected a wheel (.whl is a zip file)")
    source = open_path(arg)
    if source is not None:
        return source
    if os.sep in arg or arg.endswith((".whl", ".so")):
        raise AuditInputError(f"{arg}: no such file or directory; expected a .whl, a directory or a .so file")
    return open_distribution(arg)


def _parse(source: Source, cand: Candidate) -> ElfInfo | ElfFormatError:
    """One candidate parsed, or why it is not a readable ELF shared object (the library is then
    INVALID: every candidate is named *.so[.N] or starts like an ELF shared object, so a damaged
    executable is reported, never dropped). A member or file that cannot be read at all stops the
    audit with an error naming the input."""
    try:
        return read_elf(cand.load())
    except ElfFormatError as exc:
        # a fresh exception: the raised one's traceback (and its __context__'s) holds the reader's
        # frames, with the member's inflated bytes, for as long as the verdict is kept
        return ElfFormatError(str(exc))
    except AuditInputError as exc:
        raise AuditInputError(f"{source.label}: {exc}") from None
    except OSError as exc:
        raise AuditInputError(
            f"{source.label}: {cand.path}: cannot be read ({exc.strerror or exc}); expected a readable file"
        ) from None


def _load(sources: list[Source]) -> list[_Loaded]:
    """Parse every candidate, in input order. Several candidates are read by a pool of threads
    (inflating, and positional reads, release the GIL), the largest first."""
    work = [(source, cand) for source in sources for cand in source.candidates]
    if len(work) > 1 and (os.cpu_count() or 1) > 1:
        order = sorted(range(len(work)), key=lambda i: -work[i][1].size)
        with ThreadPoolExecutor(min(len(work), os.cpu_count() or 1, 8)) as pool:
            futures = {i: pool.submit(_parse, *work[i]) for i in order}
            parsed = [futures[i].result() for i in range(len(work))]
    else:
        parsed = [_parse(source, cand) for source, cand in work]
    return [(source, cand.path, info) for (source, cand), info in zip(work, parsed, strict=True)]


# findings an --allow pattern turns into warnings for the libraries it names
_ALLOWABLE = ("unstable", "unknown-shim", "needed-torch-library", "unneeded-torch-library")


def resolve_policy(policy: str | os.PathLike[str] | Policy | None = None, strict: bool = False) -> Policy:
    """The policy object: given, read from a file, the strict one (`strict`) or the default."""
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        if strict:
            raise AuditInputError("keel audit: --strict and --policy exclude each other; expected one")
        path = Path(policy)
        if not path.exists():
            raise AuditInputError(f"--policy {path}: no such file; expected a policy JSON file")
        if not path.is_file():
            raise AuditInputError(f"--policy {path}: not a regular file; expected a policy JSON file")
        return load_policy(path.resolve())
    return load_policy(STRICT_FILE if strict else POLICY_FILE)


def _severity(finding: Finding, policy: Policy, allowed: bool) -> Finding:
    """The finding with its severity from the policy (kept when set already; allowed -> warning)."""
    severity = finding.severity or policy.severity(finding.code)
    if allowed and finding.code in _ALLOWABLE and severity == "error":
        severity = "warning"
    return replace(finding, severity=severity) if severity != finding.severity else finding


def audit(
    paths: Sequence[str | os.PathLike[str]],
    *,
    target_torch: str | None = None,
    allow: Sequence[str] = (),
    policy: str | os.PathLike[str] | Policy | None = None,
    strict: bool = False,
) -> PackageAudit:
    """Audit wheels, directories, .so files or installed distributions as one package.

    `policy` (a Policy or a JSON file) or `strict` (keel's own gate) choose the severities;
    the default policy is data/policy.json.
    """
    if not paths:
        raise AuditInputError("keel audit: no input; expected a .whl, a directory, .so files or a distribution name")
    target = fmt(minor(parse(target_torch, "--target-torch"))) if target_torch else None
    rules = resolve_policy(policy, strict)
    with ExitStack() as stack:
        sources = [_open(os.fspath(p), stack) for p in paths]
        loaded = _load(sources)
    exports = frozenset().union(*(info.defined_names for _, _, info in loaded if isinstance(info, ElfInfo)))
    libraries: list[LibraryAudit] = []
    findings: list[Finding] = []
    by_source: dict[str, list[LibraryAudit]] = {}
    memo: tuple[dict[str, int], dict[str, int]] = ({}, {})  # per-audit symbol verdicts
    releases = shim_table().torch_versions
    # the oldest torch the libraries must load on: imports of names header-only only later are libtorch's
    oldest = target or (fmt(minor(parse(releases[0]))) if releases else "2.10")
    for source, path, info in loaded:
        label = path if len(sources) == 1 or source.kind == "file" else f"{Path(source.label).name}:{path}"
        if isinstance(info, ElfFormatError):
            lib = LibraryAudit(path=label, verdict=INVALID, error=str(info))
            findings.append(Finding("invalid-elf", label, f"{info}; expected an ELF shared object", severity="error"))
        else:
            abi3 = bool(source.tags) and all(t.split("-")[1] == "abi3" for t in source.tags)
            ctx = Context(shim_table(), cpython_table(), rules, exports, abi3, oldest, *memo)
            lib, lib_findings = classify(label, info, ctx)
            allowed = any(fnmatch.fnmatch(label, p) or fnmatch.fnmatch(Path(label).name, p) for p in allow)
            if allowed:
                lib = replace(lib, allowed=True)
            findings += [_severity(f, rules, allowed) for f in lib_findings]
        libraries.append(lib)
        by_source.setdefault(source.label, []).append(lib)
    findings += [_severity(f, rules, False) for f in package_findings(sources, by_source, target, tuple(allow))]
    valid = [lib for lib in libraries if lib.verdict != INVALID]
    verdicts = {lib.verdict for lib in valid}
    verdict = UNSTABLE if UNSTABLE in verdicts else STABLE if STABLE in verdicts else NO_TORCH
    # policies only widen with glibc, so the package's floor is its libraries' newest; unknown if any is
    floors = [lib.manylinux_floor for lib in valid if lib.manylinux_floor]
    unknown = any(lib.manylinux_excess for lib in valid)
    return PackageAudit(
        sources=tuple(s.label for s in sources),
        tags=tuple(dict.fromkeys(t for s in sources for t in s.tags)),
        libraries=tuple(libraries),
        findings=tuple(findings),
        verdict=verdict,
        torch_floor=highest([lib.torch_floor for lib in valid if lib.torch_floor]),
        python_floor=highest([lib.python_floor for lib in valid if lib.python_floor]),
        glibc_max=highest([lib.glibc_max for lib in valid if lib.glibc_max]),
        manylinux_floor=None if unknown else highest(floors),
        target_torch=target,
        policy=rules.name,
        allow=tuple(allow),
        requires_python=next((s.requires_python for s in sources if s.requires_python), None),
    )
