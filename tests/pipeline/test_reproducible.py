"""Reproducible build: one commit, one build torch, two folders -> byte-identical libraries, no build path.

Builds every library twice with `setup.py build_ext --inplace`, in two copies of the checkout at
different paths and depths, with the torch of this interpreter: the CPU libraries, and where nvcc is
installed the CUDA twins too (for sm_80 only, to keep it cheap; the flags that make them reproducible,
in cmake/KeelCuda.cmake, do not depend on the architecture).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
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


def build_copy(dest: Path) -> dict[str, bytes]:
    shutil.copytree(ROOT, dest, ignore=SKIP)
    env = {
        **os.environ,
        "KEEL_CUDA": "on" if NVCC else "off",
        "KEEL_CUDA_ARCHS": "80",
        "MAX_JOBS": os.environ.get("MAX_JOBS", "2"),
    }
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    libs = {p.relative_to(dest).as_posix(): p.read_bytes() for p in sorted((dest / "keel").rglob("*.abi3.so"))}
    assert libs, f"no library built in {dest}"
    return libs


@pytest.mark.slow
def test_two_builds_in_two_folders_are_identical_and_name_no_build_path(tmp_path):
    first = build_copy(tmp_path / "a" / "keel")
    second = build_copy(tmp_path / "elsewhere" / "much-deeper" / "checkout")
    digests = {
        rel: (hashlib.sha256(first[rel]).hexdigest(), hashlib.sha256(second.get(rel, b"")).hexdigest()) for rel in first
    }
    assert set(first) == set(second)
    if NVCC:  # the CUDA twins were built, so their bytes are compared too
        assert {"keel/_C_cuda.abi3.so", "keel/vendored/flash_attn/_C_cuda.abi3.so"} <= set(first), sorted(first)
    assert all(a == b for a, b in digests.values()), digests
    machine_paths = {str(tmp_path), str(ROOT), str(Path(torch.__file__).resolve().parent), sys.prefix, str(Path.home())}
    for rel, data in first.items():
        found = sorted(p for p in machine_paths if len(p) > 1 and p.encode() in data)
        assert not found, f"{rel} names build-machine paths {found}"
