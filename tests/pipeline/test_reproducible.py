"""Reproducible build: one commit, one build torch, two folders -> byte-identical libraries, no build path.

The first build is the wheel this suite tests (`scripts/test.sh` builds `dist/keel-*.whl` in the checkout
with `pip wheel`); this test builds every library once more with `setup.py build_ext --inplace`, in a copy of
the checkout at another path and depth, with the torch of this interpreter and the same build settings (the
environment's KEEL_CUDA / KEEL_CUDA_ARCHS, as the wheel got them): the CPU libraries, and the CUDA twins where
the wheel has them. Every library must equal the wheel's byte for byte and name no build-machine path. One
native rebuild per run, not two.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc")
SKIP = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    ".cache",
    "__pycache__",
    "*.so",
    "*.whl",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
    "bench_out",
    ".devpkgs",
)


WHEELS = sorted((ROOT / "dist").glob("keel-*.whl"))


def wheel_libraries(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n) for n in sorted(z.namelist()) if n.endswith(".abi3.so")}


def build_copy(dest: Path, cuda: bool) -> dict[str, bytes]:
    shutil.copytree(ROOT, dest, ignore=SKIP)
    env = {**os.environ, "KEEL_CUDA": "on" if cuda else "off", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    src = dest / "src"  # build_ext --inplace writes into the package folder, src/keel
    libs = {p.relative_to(src).as_posix(): p.read_bytes() for p in sorted((src / "keel").rglob("*.abi3.so"))}
    assert libs, f"no library built in {dest}"
    return libs


@pytest.mark.skipif(not WHEELS, reason="no dist/keel-*.whl: scripts/test.sh builds it before the suite")
@pytest.mark.slow
def test_two_builds_in_two_folders_are_identical_and_name_no_build_path(tmp_path):
    first = wheel_libraries(WHEELS[-1])  # built in the checkout by scripts/test.sh
    cuda = any(rel.endswith("_C_cuda.abi3.so") for rel in first)
    assert NVCC or not cuda, "the wheel has CUDA twins but nvcc is not installed here: it cannot be rebuilt"
    second = build_copy(tmp_path / "elsewhere" / "much-deeper" / "checkout", cuda)
    digests = {
        rel: (hashlib.sha256(first[rel]).hexdigest(), hashlib.sha256(second.get(rel, b"")).hexdigest()) for rel in first
    }
    assert set(first) == set(second), (sorted(first), sorted(second))
    if NVCC:  # scripts/test.sh builds the CUDA twins wherever nvcc is, so their bytes are compared too
        assert {"keel/_C_cuda.abi3.so", "keel/vendored/flash_attn/_C_cuda.abi3.so"} <= set(first), sorted(first)
    differ = sorted(rel for rel, (a, b) in digests.items() if a != b)
    assert not differ, (
        f"{differ} differ from {WHEELS[-1].name}'s (a wheel older than the checkout's sources differs too: "
        f"rebuild it with scripts/test.sh): {digests}"
    )
    machine_paths = {str(tmp_path), str(ROOT), str(Path(torch.__file__).resolve().parent), sys.prefix, str(Path.home())}
    for rel, data in first.items():
        found = sorted(p for p in machine_paths if len(p) > 1 and p.encode() in data)
        assert not found, f"{rel} names build-machine paths {found}"
