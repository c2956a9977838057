"""What the repository's prose names must exist and be openable by its reader: a path in a comment, a
docstring or a doc page names a file or folder of this checkout (or, written `COMMIT:path`, of that
commit), and no comment, docstring or page points at the project's tracker (the word issue with a number,
or a number after a hash sign), which a reader of the repository cannot open. Source reading only.

A path is resolved from the repository's root and from each folder above the file that names it (a
vendored library's or the audit's own tree names its paths from its own root); a file of a vendored
library's face (`adapters/deep_gemm`, `keel/vendored/deep_gemm`, its tests) also resolves from
`vendored_deps/<name>`. Not checked: placeholders (`vendored_deps/NAME`, `tests/.../x.cpp`, `<dir>`), globs
that match something, a path on a line that says it is upstream's, and in `vendored_deps/*/UPSTREAM.md`
(which describes the upstream tree) a path this checkout does not have. A file about another project's tree
says so once with `paths-of: <that tree>` in a comment (an HTML comment in a page); its paths are that tree's."""

from __future__ import annotations

import ast
import functools
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (
    "src",
    "audit",
    "tests",
    "docs",
    "csrc",
    "adapters",
    "vendored_deps",
    "scripts",
    "benchmarks",
    "deploy",
    "dev",
)
TOP_FILES = ("README.md", "mkdocs.yml", "CMakeLists.txt", "setup.py", "pyproject.toml")
SKIP = {"build", "dist", "site", "__pycache__", ".venv", "node_modules"}
C_LIKE = {".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh"}
HASH_COMMENTS = {".sh", ".toml", ".yml", ".yaml", ".cmake", ".txt", ".cfg"}
VENDORED = ("deep_gemm", "flash_attn")

TRACKER = re.compile(r"\bissues?\s+#?\d+|(?<![\w/.#'\"-])#\d{1,4}\b", re.IGNORECASE)
TOP = "|".join(re.escape(f) for f in (*FOLDERS, "third_party", "cmake", ".github"))
PATH = re.compile(rf"(?<![\w/.~$<>{{}}-])(?:([0-9a-f]{{7,40}}):)?((?:{TOP})/[\w./*-]*[\w*/])")
PLACEHOLDER = re.compile(r"/(?:[A-Z][A-Z_]*|\.\.\.)(?:/|$)|<|\{")


def _files() -> Iterator[Path]:
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT).parts
            if any(p in SKIP or p.endswith(".egg-info") for p in rel) or not path.is_file():
                continue
            if path.suffix in {".py", ".md", *C_LIKE, *HASH_COMMENTS} or path.name in (
                "Containerfile",
                "CMakeLists.txt",
            ):
                yield path
    yield from (ROOT / f for f in TOP_FILES if (ROOT / f).is_file())


def _python_prose(text: str) -> Iterator[tuple[int, str]]:
    """Comments and docstrings of a Python file, as (line number, text)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        yield from enumerate(text.splitlines(), 1)  # not parseable: read all of it
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for i, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + i, line


def _c_prose(text: str) -> Iterator[tuple[int, str]]:
    for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.DOTALL):
        start = text.count("\n", 0, m.start()) + 1
        for i, line in enumerate(m.group(0).splitlines()):
            yield start + i, line


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments, docstrings or (a doc page) the whole text of `path`, line by line."""
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        yield from _python_prose(text)
    elif path.suffix in C_LIKE:
        yield from _c_prose(text)
    elif path.suffix == ".md":
        yield from enumerate(text.splitlines(), 1)
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if "#" in line:
                yield i, line[line.index("#") :]


@functools.cache
def all_prose() -> dict[str, list[tuple[int, str]]]:
    """Every checked file's prose by its path from the root; read once per process, when a test needs it
    (not at collection, which every worker repeats)."""
    return {path.relative_to(ROOT).as_posix(): list(prose(path)) for path in _files()}


def _bases(rel: str) -> list[Path]:
    """The folders a path named in `rel` may be relative to."""
    parents = list(Path(rel).parents)
    bases = [ROOT / p for p in parents]
    bases += [ROOT / "vendored_deps" / v for v in VENDORED if v in Path(rel).parts]
    return bases


def _exists(named: str, rel: str) -> bool:
    if rel.endswith("/UPSTREAM.md"):
        return True  # it names the upstream tree's paths beside this checkout's
    for base in _bases(rel):
        if "*" in named:
            if any(base.glob(named)):
                return True
        elif (base / named).exists():
            return True
    return False


def _named_paths() -> Iterator[tuple[str, int, str | None, str]]:
    for rel, lines in all_prose().items():
        if any("paths-of:" in line for _, line in lines):
            continue
        for number, line in lines:
            if "upstream" in line.lower():
                continue
            for m in PATH.finditer(line):
                commit, named = m.group(1), m.group(2).rstrip(".")
                if not PLACEHOLDER.search(named):
                    yield rel, number, commit, named


def test_the_checkout_is_read():
    if not (ROOT / "src" / "keel").is_dir():
        pytest.skip("not a source checkout")
    prose_by_path = all_prose()
    assert len(prose_by_path) > 300 and "csrc/ops/fp8_linear.cpp" in prose_by_path


def test_no_tracker_references():
    found = [
        f"{rel}:{number}: {m.group(0)!r} in {line.strip()[:90]!r}"
        for rel, lines in all_prose().items()
        for number, line in lines
        for m in TRACKER.finditer(line)
    ]
    assert not found, f"{len(found)} references to the tracker (say what the change is instead):\n" + "\n".join(found)


def test_named_paths_exist():
    dead = [
        f"{rel}:{number}: {named}"
        for rel, number, commit, named in _named_paths()
        if not commit and not _exists(named, rel)
    ]
    assert not dead, f"{len(dead)} paths named in comments, docstrings or pages do not exist:\n" + "\n".join(dead)


def test_paths_named_at_a_commit_exist_there():
    historical = sorted({f"{commit}:{named}" for _, _, commit, named in _named_paths() if commit})
    if not historical:
        pytest.skip("no COMMIT:path named")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        input="\n".join(historical) + "\n",
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    missing = [line.split()[0] for line in out.stdout.splitlines() if line.endswith("missing")]
    assert out.returncode == 0 and not missing, f"named at a commit that lacks them: {missing}"
