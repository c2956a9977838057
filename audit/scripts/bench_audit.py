"""Benchmark `keel audit` against torch-abi-audit 0.3.0 on the same unpacked tree.

Builds, in a temp dir, a synthetic wheel of ~500 MB (many large .so files: a few thousand dynamic
symbols each plus an incompressible payload section), then times keel on the .whl and on the
unpacked tree, and torch-abi-audit on the unpacked tree. Prints a markdown table.

    python audit/scripts/bench_audit.py [--size-mb 500] [--files 100] [--wheel dist/keel-*.whl] [--audit-dir DIR]

--audit-dir times another copy of the audit package (audit/src/keel_audit, or an older commit's
keel/audit from `git archive`, for before/after on one box).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

AUDIT = Path(__file__).resolve().parents[1]  # audit/
ROOT = AUDIT.parent  # keel's checkout (its dist/ holds keel's wheel)
N_UNSTABLE, N_SHIM, N_EXPORTED = 1500, 300, 1000


def _load_audit(where: Path = AUDIT / "src" / "keel_audit"):
    """The audit package at `where`, loaded by file path under a private name (relative imports only)."""
    spec = importlib.util.spec_from_file_location(
        "_bench_audit", where / "__init__.py", submodule_search_locations=[str(where)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["_bench_audit"] = module
    spec.loader.exec_module(module)
    return module


def base_library(work: Path, audit) -> Path:
    """One C++ shared object: shim calls, unstable at:: references, exported functions."""
    tables = getattr(audit, "symbol_tables", None) or audit.table  # `table` before keel-audit 0.2's layout
    shims = sorted(tables.shim_table().symbols)[:N_SHIM]
    lines = ["#include <vector>", 'extern "C" {'] + [f"int {s}();" for s in shims] + ["}"]
    lines += ["namespace at { struct Tensor { long x; };"]
    lines += [f"void op{i}(const std::vector<Tensor>&, long, double);" for i in range(N_UNSTABLE)] + ["}"]
    lines += ["void use_all() { std::vector<at::Tensor> v;"]
    lines += [f"  {s}();" for s in shims] + [f"  at::op{i}(v, {i}, 1.0);" for i in range(N_UNSTABLE)] + ["}"]
    lines += [f"int exported_{i}(int x) {{ return x * {i}; }}" for i in range(N_EXPORTED)]
    src = work / "base.cpp"
    src.write_text("\n".join(lines) + "\n")
    out = work / "base.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


def synthetic_wheel(work: Path, base: Path, size_mb: int, files: int) -> tuple[Path, Path]:
    """A wheel and its unpacked tree: `files` copies of base.so, each padded with random bytes."""
    tree = work / "tree"
    (tree / "synth").mkdir(parents=True)
    per_file = size_mb * (1 << 20) // files
    wheel = work / "synth-0.1-cp310-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for i in range(files):
            blob = work / "blob.bin"
            blob.write_bytes(os.urandom(per_file))
            name = f"synth/_ext{i}.abi3.so" if i % 10 else f"synth.libs/libdep{i}.so.1"
            target = tree / name
            target.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["objcopy", "--add-section", f".payload={blob}", str(base), str(target)], check=True)
            zf.write(target, name)
        zf.writestr("synth-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp310-abi3-linux_x86_64\n")
        zf.writestr("synth-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: synth\nVersion: 0.1\n")
    return wheel, tree


def timed(fn, repeat: int = 3, audit=None) -> float:
    """Best wall time of `repeat` runs; keel's symbol caches are cleared before each run."""
    best = float("inf")
    for _ in range(repeat):
        if audit is not None:
            for memo in ("torch_refs", "unstable_torch_namespace"):  # whichever the timed copy memoises
                getattr(getattr(audit.mangling, memo), "cache_clear", lambda: None)()
            audit.mangling.demangle.cache_clear()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def peer(tree: Path) -> None:
    """torch-abi-audit on a tree, output discarded."""
    from torch_abi_audit.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([str(tree), "--check", "torch"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--wheel", default=str(ROOT / "dist/keel-*.whl"), help="keel's own wheel (glob)")
    parser.add_argument("--audit-dir", type=Path, default=AUDIT / "src" / "keel_audit", help="audit package to time")
    args = parser.parse_args()
    audit = _load_audit(args.audit_dir)
    rows = []
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmp:
        work = Path(tmp)
        own = sorted(glob.glob(args.wheel))
        if own:
            own_tree = work / "own"
            with zipfile.ZipFile(own[-1]) as zf:
                zf.extractall(own_tree)
            rows.append(
                (
                    Path(own[-1]).name,
                    os.path.getsize(own[-1]),
                    timed(lambda: audit.audit([own[-1]], target_torch="2.10"), audit=audit),
                    timed(lambda: audit.audit([own_tree]), audit=audit),
                    timed(lambda: peer(own_tree)),
                )
            )
        base = base_library(work, audit)
        start = time.perf_counter()
        wheel, tree = synthetic_wheel(work, base, args.size_mb, args.files)
        print(
            f"built {wheel.name} ({wheel.stat().st_size / 2**20:.0f} MiB, {args.files} .so files, "
            f"{len(audit.elf.read_elf(base).undefined)} undefined symbols each) "
            f"in {time.perf_counter() - start:.1f} s"
        )
        rows.append(
            (
                wheel.name,
                wheel.stat().st_size,
                timed(lambda: audit.audit([wheel]), audit=audit),
                timed(lambda: audit.audit([tree]), audit=audit),
                timed(lambda: peer(tree), repeat=1),
            )
        )
    print(
        "\n| input | size | keel (.whl) | keel (tree) | torch-abi-audit (tree) | peer / keel-tree | peer / keel-whl |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, size, whl, tree_t, peer_t in rows:
        print(
            f"| {name} | {size / 2**20:.0f} MiB | {whl:.2f} s | {tree_t:.2f} s | {peer_t:.2f} s | "
            f"{peer_t / tree_t:.1f}x | {peer_t / whl:.1f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
