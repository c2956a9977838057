#!/usr/bin/env python
"""keel-audit against torch-abi-audit 0.3.0 on real public wheels: one table of every disagreement.

Downloads each wheel once into a cache (pip download --no-deps --only-binary :all:), unpacks it
there for the peer (which cannot read wheels), audits the .whl with keel-audit and the unpacked
packages with torch-abi-audit, and prints, per library, both verdicts and torch floors where they
differ, with the reason keel gives. `--time N` also times both tools end to end (fresh processes,
alternating, N rounds; medians and ratios from the same run).

    python audit/scripts/audit_real_wheels.py --cache /work/cache/wheels vllm==0.33.0 torchao==0.18.0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from keel_audit import LibraryAudit, PackageAudit, audit
from keel_audit.mangling import demangle

DEFAULT = ("vllm==0.33.0", "torchao==0.18.0", "xformers==0.0.35")


@dataclass(frozen=True)
class PeerLib:
    """One extension as torch-abi-audit reports it."""

    verdict: str  # STABLE / UNSTABLE / NO-TORCH
    floor: str | None
    unstable: tuple[str, ...]


def fetch(spec: str, cache: Path) -> Path:
    """The cached wheel for `name==version`, downloaded when missing."""
    name, _, version = spec.partition("==")
    for wheel in sorted(cache.glob("*.whl")):
        dist, ver, _build, _tags = parse_wheel_filename(wheel.name)
        if dist == canonicalize_name(name) and (not version or str(ver) == version):
            return wheel
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}  # this machine caps torch-family versions
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", spec, "-d", str(cache)]
    subprocess.run(cmd, check=True, env=env)
    return fetch(spec, cache)


def unpack(wheel: Path, cache: Path) -> Path:
    """The wheel unpacked under cache/<stem>/ (once)."""
    tree = cache / wheel.name.removesuffix(".whl")
    if not tree.is_dir():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(tree)
    return tree


def _packages(tree: Path) -> list[Path]:
    return sorted(p for p in tree.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", ".data")))


def peer(tree: Path) -> tuple[dict[str, PeerLib], list[str]]:
    """torch-abi-audit's per-extension verdicts (path relative to the tree) and its error lines."""
    exe = shutil.which("torch-abi-audit", path=str(Path(sys.executable).parent)) or shutil.which("torch-abi-audit")
    if exe is None:
        raise SystemExit("audit_real_wheels: torch-abi-audit not found (pip install torch-abi-audit==0.3.0)")
    out: dict[str, PeerLib] = {}
    errors: list[str] = []
    for pkg in _packages(tree):
        proc = subprocess.run([exe, str(pkg), "--json"], capture_output=True, text=True, check=False)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            errors.append(f"{pkg.name}: {proc.stderr.strip()[:200]}")
            continue
        for ext in doc.get("extensions", []) + doc.get("bundled_libs", []):
            t = ext.get("torch") or {}
            verdict = "NO-TORCH" if not t.get("uses_torch") else "STABLE" if t.get("stable") else "UNSTABLE"
            floor = t.get("min_torch_version")
            rel = str(Path(ext["path"]).resolve().relative_to(tree.resolve()))
            out[rel] = PeerLib(
                verdict, ".".join(floor.split(".")[:2]) if floor else None, tuple(t.get("unstable_symbols") or ())
            )
    return out, errors


def _reason(lib: LibraryAudit | None, other: PeerLib | None, result: PackageAudit) -> str:
    """Why keel's verdict differs, from what keel found."""
    if lib is None:
        return "keel reads no such library"
    if other is None:
        if not lib.path.endswith(".so"):
            return "peer globs *.so only; keel reads every ELF shared object (found by its header)"
        return "peer did not report it"
    if lib.verdict == "UNSTABLE" and other.verdict != "UNSTABLE":
        first = (lib.unstable_undefined or lib.unstable_exported)[:1]
        kind = "imports" if lib.unstable_undefined else "defines (compiled-in layout)"
        return f"keel: {kind} {demangle(first[0])[:90]}" if first else "keel: unknown shim symbols"
    if other.verdict == "UNSTABLE" and lib.verdict != "UNSTABLE":
        shown = ", ".join(demangle(n)[:60] for n in other.unstable[:2])
        return f"peer flags {shown}; keel: header-only or not a libtorch symbol"
    if lib.verdict == "NO-TORCH" and other.verdict == "STABLE":
        return "peer counts DT_NEEDED/other torch text; keel finds no shim symbol"
    if lib.torch_floor != other.floor:
        return f"floor: keel {lib.torch_floor} from {', '.join(lib.floor_symbols[:2])}; peer {other.floor}"
    return "verdict differs"


def compare(spec: str, cache: Path) -> tuple[list[list[str]], list[str]]:
    """Rows (wheel, library, keel, peer, reason) for every disagreement, and a summary line."""
    wheel = fetch(spec, cache)
    tree = unpack(wheel, cache)
    result = audit([wheel])
    theirs, errors = peer(tree)
    ours = {lib.path: lib for lib in result.libraries}
    rows = []
    for path in sorted(set(ours) | set(theirs)):
        lib, other = ours.get(path), theirs.get(path)
        mine = f"{lib.verdict} {lib.torch_floor or '-'}" if lib else "-"
        peer_cell = f"{other.verdict} {other.floor or '-'}" if other else "-"
        if mine != peer_cell:
            rows.append([spec, path, mine, peer_cell, _reason(lib, other, result)])
    peer_floor = max(
        (p.floor for p in theirs.values() if p.floor), key=lambda v: tuple(map(int, v.split("."))), default=None
    )
    used = [lib for lib in result.libraries if lib.verdict != "NO-TORCH"]
    stable = sum(lib.verdict == "STABLE" for lib in used)
    summary = (
        f"{spec}: keel {result.verdict} floor {result.torch_floor} ({stable}/{len(used)} torch-using STABLE; "
        f"{result.count('error')} errors, {result.count('warning')} warnings: "
        f"{', '.join(sorted({f.code for f in result.findings if f.severity != 'note'})) or 'none'}); "
        f"peer floor {peer_floor}, {sum(p.verdict == 'STABLE' for p in theirs.values())}/"
        f"{sum(p.verdict != 'NO-TORCH' for p in theirs.values())} STABLE"
        + (f"; peer errors: {'; '.join(errors)}" if errors else "")
    )
    return rows, [summary]


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def timing(spec: str, cache: Path, rounds: int) -> str:
    """End-to-end seconds (fresh process each) of keel on the .whl and the tree, and of the peer on the tree."""
    wheel = fetch(spec, cache)
    tree = unpack(wheel, cache)
    keel = [sys.executable, "-m", "keel_audit"]
    peer_exe = shutil.which("torch-abi-audit", path=str(Path(sys.executable).parent)) or "torch-abi-audit"
    pkgs = [str(p) for p in _packages(tree)]
    commands = {
        "keel .whl": keel + [str(wheel)],
        "keel tree": keel + [str(tree)],
        "peer tree": [peer_exe, *pkgs],
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(rounds):
        for name, cmd in commands.items():  # alternate: one of each per round
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=False)
            times[name].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the tool and every process it ran
            cpu[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    med = {k: statistics.median(v) for k, v in times.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    lines = [
        f"{spec}: median of {rounds} alternating rounds (fresh processes, process start included); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    ]
    lines += [
        f"  {k}: wall {med[k]:.2f} s (runs {', '.join(f'{t:.2f}' for t in times[k])}), cpu {mcpu[k]:.2f} s"
        for k in commands
    ]
    lines.append(
        f"  wall: peer tree / keel tree = {med['peer tree'] / med['keel tree']:.2f}x, "
        f"peer tree / keel .whl = {med['peer tree'] / med['keel .whl']:.2f}x; "
        f"cpu: peer tree / keel tree = {mcpu['peer tree'] / mcpu['keel tree']:.2f}x"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=list(DEFAULT), help="name==version of public wheels")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "keel-audit-wheels")
    parser.add_argument("--time", type=int, default=0, metavar="N", help="also time both tools, N rounds")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    rows: list[list[str]] = [["wheel", "library", "keel", "torch-abi-audit", "reason"]]
    summaries: list[str] = []
    for spec in args.specs:
        got, summary = compare(spec, args.cache)
        rows += got
        summaries += summary
    print(_table(rows) if len(rows) > 1 else "no disagreements")
    print()
    print("\n".join(summaries))
    for spec in args.specs if args.time else ():
        print(timing(spec, args.cache, args.time))
    return 0


if __name__ == "__main__":
    sys.exit(main())
