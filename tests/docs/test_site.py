"""The docs are a site that builds in strict mode, README.md stays a front page, and relative links resolve."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs.blocks import ROOT, doc_pages

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(`{3,})")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (requirements-test.txt pins it)")
    pytest.importorskip("material", reason="mkdocs-material is not installed (requirements-test.txt pins it)")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
    )


def copy_docs(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs", ignore=shutil.ignore_patterns("_incoming"))
    shutil.copy(ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


def test_site_builds_in_strict_mode(tmp_path: Path):
    proc = build(ROOT, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "measurements" / "index.html").is_file()


@pytest.mark.parametrize("damage", ["broken-link", "page-not-in-nav"])
def test_strict_build_fails_on_a_broken_site(tmp_path: Path, damage: str):
    """The strict build is what catches these: a link to a missing page, a page the navigation omits."""
    root = copy_docs(tmp_path)
    if damage == "broken-link":
        page = root / "docs" / "index.md"
        page.write_text(page.read_text() + "\nSee [a page that is gone](no-such-page.md).\n")
    else:
        (root / "docs" / "orphan.md").write_text("# An orphan\n\nNo navigation entry names this page.\n")
    proc = build(root, tmp_path / "site")
    assert proc.returncode != 0, f"mkdocs build --strict passed with {damage}:\n{proc.stderr}"


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, (
        f"README.md has {len(lines)} lines; the front page holds at most 200 (move detail to docs/)"
    )


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    for command in ("bash scripts/demo.sh", "bash scripts/test.sh"):
        assert command in text, f"README.md does not show `{command}`"
        assert (ROOT / command.split()[1]).is_file(), f"README.md shows `{command}`, but there is no such script"


def relative_links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative Markdown link outside code blocks and code spans."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for n, line in enumerate(page.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if m:
            fence = None if fence and m.group(1).startswith(fence) else (fence or m.group(1))
            continue
        if fence:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
                out.append((n, target))
    return out


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    missing = [
        f"{page.relative_to(ROOT)}:{n}: {target}"
        for n, target in relative_links(page)
        if not (page.parent / target.split("#", 1)[0]).exists()
    ]
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_link_check_sees_a_broken_link(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](gone.md#x) `[not a link](nowhere.md)`\n```\n[in code](x.md)\n```\n")
    assert relative_links(page) == [(1, "page.md"), (1, "gone.md#x")]


TOPICS = ("llama.cpp", "vLLM", "pipeline", "audit", "suite")


def nav_entries(nav: object) -> int:
    """Pages listed in mkdocs.yml's `nav`, sections counted by their pages."""
    if isinstance(nav, list):
        return sum(nav_entries(item) for item in nav)
    if isinstance(nav, dict):
        return sum(nav_entries(v) for v in nav.values())
    return 1


def test_nav_lists_topics_not_records():
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert nav_entries(nav) <= 15, f"mkdocs.yml's nav has {nav_entries(nav)} entries; at most 15 (topics, not records)"
    assert nav_entries([{"A": "a.md"}, {"B": ["b.md", {"C": "c.md"}]}]) == 3


def test_measurements_index_leads_with_the_latest_figures():
    """The first table of docs/measurements/index.md has one row per topic, each linking an existing record."""
    index = ROOT / "docs" / "measurements" / "index.md"
    lines = index.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert not any(line.startswith("#") for line in lines[1:first]), "a section comes before the first table"
    rows = [line for line in lines[first + 2 :] if line.startswith("|")][: len(TOPICS)]
    for topic, row in zip(TOPICS, rows, strict=True):
        assert topic in row.split("|")[1], f"row {row[:60]!r}: expected the topic {topic!r}"
        targets = [t.split("#")[0] for t in LINK.findall(row)]
        assert targets and all((index.parent / t).is_file() for t in targets), row
