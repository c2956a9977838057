"""Every file in benchmarks/ reproduces a dated record: its header (docstring or leading comments) names a page
of docs/measurements/ that exists, and that page names the file's command, or the command of the benchmark
that uses the file (a helper such as soak/traffic.py or ops_twin.cpp). Source reading only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
PAGE = re.compile(r"docs/measurements/(\d{4}-\d{2}-\d{2}-[\w-]+\.md)")
# a file with no record yet, and why
NO_RECORD = {
    "benchmarks/cuda_cases.py": "the --device cuda half of gemm/attention/ops: no GPU run is recorded yet",
}


def benchmark_files() -> list[Path]:
    if not BENCH.is_dir():
        return []
    return sorted(
        p
        for p in BENCH.rglob("*")
        if p.is_file()
        and p.suffix in {".py", ".sh", ".cpp"}
        and p.name != "__init__.py"
        and "__pycache__" not in p.parts
    )


def header(path: Path) -> str:
    """A Python file's module docstring; another file's leading comment lines."""
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text)) or ""
    lines = []
    for line in text.splitlines():
        if not line.startswith(("#", "//")):
            break
        lines.append(line)
    return "\n".join(lines)


def users(path: Path) -> list[str]:
    """The benchmarks whose source names `path` (its file name, or its module name for a Python helper)."""
    names = {path.name, path.stem}
    return [
        other.relative_to(ROOT).as_posix()
        for other in benchmark_files()
        if other != path and any(re.search(rf"\b{re.escape(n)}\b", other.read_text()) for n in names)
    ]


def test_there_are_benchmarks():
    if not BENCH.is_dir():
        pytest.skip("not a source checkout")
    assert len(benchmark_files()) >= 10


@pytest.mark.parametrize("path", benchmark_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_benchmark_names_its_record_and_the_record_its_command(path: Path):
    rel = path.relative_to(ROOT).as_posix()
    if rel in NO_RECORD:
        pytest.skip(NO_RECORD[rel])
    pages = PAGE.findall(header(path))
    assert pages, f"{rel}: its docstring (or leading comments) names no docs/measurements/ page it reproduces"
    commands = [rel, *users(path)]
    for page in pages:
        record = ROOT / "docs" / "measurements" / page
        assert record.is_file(), f"{rel} names docs/measurements/{page}, which does not exist"
    assert any(c in (ROOT / "docs" / "measurements" / p).read_text() for p in pages for c in commands), (
        f"{rel}: none of {pages} names {' or '.join(commands)}"
    )


def test_a_file_without_a_record_is_listed_and_exists():
    for rel in NO_RECORD:
        assert (ROOT / rel).is_file(), f"NO_RECORD lists {rel}, which is gone: remove it from the list"
