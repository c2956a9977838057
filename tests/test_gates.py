"""The repository's lint, format and type gates (the same hooks as .pre-commit-config.yaml): the suite,
and so CI, fails when any of them does. Tools come from the test environment (requirements-test.txt
pins them), so every machine formats alike."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CPP_SUFFIXES = {".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu"}

pytestmark = pytest.mark.skipif(not (ROOT / "pyproject.toml").is_file(), reason="not a source checkout")


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed in this environment (pip install -r requirements-test.txt)")
    return found


def _run(*cmd: str, cwd: Path = ROOT) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"


def _tracked(suffixes: set[str]) -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.split()
    if not out:  # not a git checkout (an unpacked copy): walk the source folders instead
        dirs = ("csrc", "adapters", "vendored_deps", "scripts", "benchmarks")
        return sorted(str(p.relative_to(ROOT)) for d in dirs for p in (ROOT / d).rglob("*") if p.suffix in suffixes)
    return [f for f in out if Path(f).suffix in suffixes and (ROOT / f).is_file()]


def test_ruff_format():
    _run(_tool("ruff"), "format", "--check", "--diff", ".")


def test_ruff_check():
    _run(_tool("ruff"), "check", ".")


@pytest.fixture(scope="module")
def mypy_runs() -> Iterator[dict[str, subprocess.Popen]]:
    """Both mypy runs started side by side on the first test that needs one (in a fresh checkout each is a
    single-threaded cold run of tens of seconds); each test then waits for its own."""
    mypy = _tool("mypy")
    runs = {
        # keel at mypy's default strictness ([tool.mypy] in pyproject.toml)
        "keel": ((mypy, "--cache-dir=.cache/mypy"), ROOT),
        # the keel-audit distribution under mypy --strict (audit/pyproject.toml's [tool.mypy]): it ships py.typed
        "audit": ((mypy, "--cache-dir=../.cache/mypy-audit"), ROOT / "audit"),
    }
    procs = {
        name: subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, (cmd, cwd) in runs.items()
    }
    yield procs
    for proc in procs.values():  # a test that was not run (deselected, -x) leaves its run behind
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _finished(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed (exit {proc.returncode}):\n{out}"


@pytest.mark.slow  # the whole package type-checked (the pre-commit hook runs it too)
def test_mypy_keel(mypy_runs):
    _finished(mypy_runs["keel"])


@pytest.mark.slow  # the whole audit package type-checked, strict
def test_mypy_keel_audit_strict(mypy_runs):
    _finished(mypy_runs["audit"])


def test_clang_format():
    files = _tracked(CPP_SUFFIXES)
    assert files, "no C++/CUDA sources found"
    _run(_tool("clang-format"), "--dry-run", "--Werror", *files)
