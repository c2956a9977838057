"""TORCH_TARGET_VERSION is live: keel's op wrappers compile against the 2.10 stable ABI (the
control), and fail against 2.9, whose stable ABI lacks parallel_for and torch_call_dispatcher.
Syntax-only compiles of the sources with the installed torch's headers, run side by side (one per core) on the
first test that needs them; each test then reads its own compile's result."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
OPS = sorted((ROOT / "csrc" / "ops").glob("*.cpp")) if (ROOT / "csrc").is_dir() else []
WRAPPERS = [p for p in OPS if not p.stem.endswith("_cpu") and p.stem != "cpu_isa"]
CXX = shutil.which("g++") or shutil.which("c++")

pytestmark = [
    pytest.mark.skipif(not (CXX and WRAPPERS), reason="needs a C++ compiler and the source tree"),
    pytest.mark.slow,  # C++ compiles of every op wrapper
]


def compile_syntax(sources: list[Path], target: tuple[int, int]) -> subprocess.CompletedProcess:
    version = hex((target[0] << 56) | (target[1] << 48))
    cmd = [
        CXX,
        "-fsyntax-only",
        "-std=c++17",
        f"-I{ROOT / 'csrc'}",
        f"-isystem{Path(torch.__file__).parent / 'include'}",
        f"-DTORCH_TARGET_VERSION={version}",
        *map(str, sources),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every compile of this module, side by side, one source each: the control (2.10: every wrapper and the
    bindings) and 2.9 (every wrapper: its errors must be its own)."""
    jobs = {("2.10", p.name): ([p], (2, 10)) for p in [*WRAPPERS, ROOT / "csrc" / "bindings.cpp"]}
    jobs |= {("2.9", p.name): ([p], (2, 9)) for p in WRAPPERS}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {name: pool.submit(compile_syntax, *job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def test_control_compiles_for_2_10(compiled):
    failed = {
        name: out.stderr[-2000:] for (target, name), out in compiled.items() if target == "2.10" and out.returncode
    }
    assert not failed, failed


@pytest.mark.parametrize("source", WRAPPERS, ids=lambda p: p.name)
def test_fails_for_2_9(source, compiled):
    out = compiled["2.9", source.name]
    assert out.returncode != 0, f"{source.name} compiled against the 2.9 stable ABI; TORCH_TARGET_VERSION is not live"
    assert "parallel_for" in out.stderr or "torch_call_dispatcher" in out.stderr, out.stderr[-2000:]
