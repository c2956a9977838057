#!/usr/bin/env python
"""Mutation harness of keel-audit: real ELF libraries, damaged on purpose, must each get a verdict
or exit 2 with a message naming the file; never a traceback, never a hang.

Inputs are wheels (their ELF members), .so files or folders of them. Case i takes library i mod
L and mutation i mod M (its parameters from a seeded RNG, so a seed reproduces a run) and audits
the result as a .so file or, every other round over the libraries, as the only member of a small
wheel (zip-level damage only there), in a fresh `python -m keel_audit --json` process with a
timeout (or in this process with `--in-process`, for speed).

    python audit/scripts/mutate_elf.py /work/cache/wheels/vllm-*.whl --cases 150 --seed 1
    python audit/scripts/mutate_elf.py /usr/lib/x86_64-linux-gnu/libz.so.1 --cases 40 --in-process

Outcomes: verdict (exit 0/1 with a keel-audit/2 document), error (exit 2, `keel audit: error:`
naming the input), and the failures: traceback, hang, unclear (anything else). Exit 0 only when
there is no failure; failing cases are kept under --keep DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elf_layout import Layout  # noqa: E402
from elf_mutations import MUTATIONS, ZIP_MUTATIONS  # noqa: E402

ELF_MAGIC = b"\x7fELF"
FAILURES = ("traceback", "hang", "unclear")


@dataclass(frozen=True)
class Library:
    """One real ELF object to mutate: where it came from and its bytes."""

    origin: str  # "wheel.whl:path/in/wheel.so" or a file path
    member: str  # its path inside a wheel (the file name for a file)
    data: bytes


@dataclass(frozen=True)
class Outcome:
    """What auditing one mutated case gave."""

    case: str
    mutation: str
    origin: str
    kind: str  # verdict / error / traceback / hang / unclear
    exit_code: int | None
    detail: str
    seconds: float


def libraries(inputs: list[Path], max_bytes: int) -> list[Library]:
    """The ELF objects of every input (wheel members, files, files under folders), up to max_bytes each."""
    out: list[Library] = []
    for path in inputs:
        if path.is_dir():
            out += libraries(sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()), max_bytes)
        elif zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if info.is_dir() or not 64 <= info.file_size <= max_bytes:
                        continue
                    with zf.open(info) as fh:
                        if fh.read(4) != ELF_MAGIC:
                            continue
                    out.append(Library(f"{path.name}:{info.filename}", info.filename, zf.read(info)))
        elif path.is_file() and 64 <= path.stat().st_size <= max_bytes:
            with open(path, "rb") as fh:
                if fh.read(4) == ELF_MAGIC:
                    out.append(Library(str(path), path.name, path.read_bytes()))
    return out


def write_wheel(path: Path, member: str, data: bytes) -> None:
    """A one-member wheel holding `data` at `member`, with WHEEL and METADATA."""
    dist = "mutant-0.1.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp310-abi3-linux_x86_64\n")
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: mutant\nVersion: 0.1\nRequires-Dist: torch\n")
        zf.writestr(f"{dist}/RECORD", "")


def _looks_like_a_library(name: str, data: bytes) -> bool:
    """Whether the audit must list this file: named *.so[.N], or starting like an ELF ET_DYN object."""
    if re.search(r"\.so(\.\d+)*$", name):
        return True
    order: Literal["little", "big"] = "little" if data[5:6] == b"\x01" else "big"
    return data[:4] == ELF_MAGIC and len(data) >= 18 and int.from_bytes(data[16:18], order) == 3


def make_case(libs: list[Library], i: int, seed: int, work: Path) -> tuple[Path, str, str, str | None]:
    """Case i: (file, mutation name, origin, the library path the audit must list or None); the
    same for a seed on every run (each case has its own RNG)."""
    rng = random.Random(f"{seed}:{i}")
    lib = libs[i % len(libs)]  # every library in turn, each round alternating file and wheel
    as_wheel = (i // len(libs)) % 2 == 1
    pool = sorted(MUTATIONS) + (sorted(ZIP_MUTATIONS) if as_wheel else [])
    name = pool[i % len(pool)]
    stem = f"case{i:04d}-{name}"
    if name in ZIP_MUTATIONS:  # the member is intact: listed, or the damaged zip is an error
        path = work / f"{stem}.whl"
        write_wheel(path, lib.member, lib.data)
        path.write_bytes(ZIP_MUTATIONS[name](path.read_bytes(), rng))
        return path, name, lib.origin, lib.member
    data = MUTATIONS[name](Layout.parse(lib.data), rng)
    if as_wheel:
        path = work / f"{stem}.whl"
        write_wheel(path, lib.member, data)
        return path, name, lib.origin, lib.member if _looks_like_a_library(lib.member, data) else None
    path = work / f"{stem}-{Path(lib.member).name}"
    path.write_bytes(data)
    return path, name, lib.origin, path.name  # a file named on the command line is always audited


def judge(case: Path, code: int | None, out: str, err: str, listed: str | None = None) -> tuple[str, str]:
    """(kind, detail) of one finished audit; a verdict must list the library `listed` (the damaged
    one: a verdict that leaves it out says nothing about it)."""
    if "Traceback (most recent call last)" in err or "Traceback (most recent call last)" in out:
        return "traceback", err[-2000:]
    if code in (0, 1):
        try:
            doc = json.loads(out)
        except ValueError:
            return "unclear", f"exit {code} without a JSON document: {out[-300:]!r}"
        if doc.get("schema") != "keel-audit/2" or doc.get("exit_code") != code:
            return "unclear", f"exit {code}, document {str(doc)[:300]}"
        if listed is not None and listed not in {lib.get("path") for lib in doc.get("libraries", ())}:
            return "unclear", f"exit {code}, but {listed} is not among the audited libraries"
        return "verdict", doc.get("verdict", "")
    if code == 2:
        lines = err.splitlines()
        first = next((i for i, ln in enumerate(lines) if ln.startswith("keel audit: error: ")), None)
        if first is not None and (case.name in err or str(case) in err):
            return "error", " / ".join(ln.strip() for ln in lines[first : first + 2])[:400]
        return "unclear", f"exit 2 without a message naming {case.name}: {err[-500:]!r}"
    return "unclear", f"exit {code}: {err[-500:]!r}"


def run_subprocess(case: Path, timeout: float) -> tuple[int | None, str, str]:
    """`python -m keel_audit CASE --json` in a fresh process (None: it ran past the timeout)."""
    cmd = [sys.executable, "-m", "keel_audit", str(case), "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=case.parent)
    except subprocess.TimeoutExpired:
        return None, "", ""
    return proc.returncode, proc.stdout, proc.stderr


class _Timeout(BaseException):
    """Raised by SIGALRM inside an in-process audit (BaseException: the audit catches no such thing)."""


def run_in_process(case: Path, timeout: float) -> tuple[int | None, str, str]:
    """keel_audit.cli.main in this process, stdout/stderr captured; a SIGALRM timer bounds it."""
    from keel_audit.cli import main

    out, err = io.StringIO(), io.StringIO()

    def alarm(_signum: int, _frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code: int | None = main([str(case), "--json"])
    except _Timeout:
        code = None
    except BaseException:  # what a user would see as a traceback
        err.write(traceback.format_exc())
        code = -1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def run(
    libs: list[Library],
    n: int,
    seed: int,
    timeout: float,
    jobs: int,
    in_process: bool,
    work: Path,
    keep: Path | None = None,
    progress: bool = False,
) -> list[Outcome]:
    """Build, audit and delete n cases (failing ones are copied to `keep`); in-process runs one at a
    time (SIGALRM needs the main thread)."""

    def one(i: int) -> Outcome:
        case, mutation, origin, listed = make_case(libs, i, seed, work)
        start = time.perf_counter()
        code, out, err = (run_in_process if in_process else run_subprocess)(case, timeout)
        seconds = time.perf_counter() - start
        kind, detail = (
            ("hang", f"no result within {timeout} s") if code is None else judge(case, code, out, err, listed)
        )
        if keep is not None and kind in FAILURES:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(case, keep / case.name)
        case.unlink()
        return Outcome(case.name, mutation, origin, kind, code, detail, seconds)

    def counted(i: int) -> Outcome:
        outcome = one(i)
        if progress and (i + 1) % 10 == 0:
            print(f"  case {i + 1}/{n}", file=sys.stderr, flush=True)
        return outcome

    if in_process or jobs <= 1:
        return [counted(i) for i in range(n)]
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(counted, range(n)))


def report(outcomes: list[Outcome]) -> str:
    """Counts per outcome and per mutation, then every failure."""
    kinds = Counter(o.kind for o in outcomes)
    lines = [
        f"{len(outcomes)} cases: " + ", ".join(f"{kinds[k]} {k}" for k in ("verdict", "error", *FAILURES)),
        f"slowest case {max((o.seconds for o in outcomes), default=0):.2f} s",
        "",
        f"{'mutation':28} {'cases':>5} {'verdict':>7} {'error':>5} {'failed':>6}",
    ]
    for name in sorted({o.mutation for o in outcomes}):
        group = [o for o in outcomes if o.mutation == name]
        c = Counter(o.kind for o in group)
        failed = sum(c[k] for k in FAILURES)
        lines.append(f"{name:28} {len(group):5} {c['verdict']:7} {c['error']:5} {failed:6}")
    for o in outcomes:
        if o.kind in FAILURES:
            lines += ["", f"{o.kind.upper()} {o.case} ({o.mutation} of {o.origin}, exit {o.exit_code}):", o.detail]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="wheels, ELF files or folders")
    parser.add_argument("--cases", type=int, default=150, help="mutated cases in all (default 150)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    parser.add_argument("--jobs", type=int, default=2, help="cases audited at once (subprocess mode)")
    parser.add_argument("--max-mb", type=float, default=64.0, help="skip libraries larger than this")
    parser.add_argument("--in-process", action="store_true", help="audit in this process (fast; SIGALRM timeout)")
    parser.add_argument("--keep", type=Path, help="copy failing cases here (the others are deleted once audited)")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    args = parser.parse_args(argv)
    libs = libraries(args.inputs, int(args.max_mb * (1 << 20)))
    if not libs:
        raise SystemExit("mutate_elf: no ELF objects in the inputs (or all above --max-mb)")
    print(f"{len(libs)} ELF objects from {len(args.inputs)} inputs; {args.cases} cases, seed {args.seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mutate_elf_") as tmp:
        start = time.perf_counter()
        outcomes = run(
            libs, args.cases, args.seed, args.timeout, args.jobs, args.in_process, Path(tmp), args.keep, progress=True
        )
        wall = time.perf_counter() - start
    print(report(outcomes))
    print(f"\n{wall:.0f} s wall for {len(outcomes)} cases ({'in process' if args.in_process else f'{args.jobs} jobs'})")
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    return 1 if any(o.kind in FAILURES for o in outcomes) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    sys.exit(main())
