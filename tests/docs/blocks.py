"""The code blocks of the docs that are marked to run, and their declared settings.

A block runs only when an HTML comment right before its fence marks it:

- ``<!-- check: SETTINGS -->`` before a ``bash`` or ``python`` block: it must exit 0;
- ``<!-- transcript: SETTINGS -->`` before a ``console`` block of ``$ command`` lines, each followed by
  what it prints: each command runs and its output must equal the one shown, after the masks.

SETTINGS are shell-quoted ``key=value`` words or bare flags (KNOWN below); ``mask`` may repeat.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*(check|transcript):(.*?)-->\s*$")
FENCE = re.compile(r"^(`{3,})\s*([\w-]*)")
KNOWN = {"timeout", "env", "needs", "cwd", "mask", "slow", "server", "health"}
NEEDS = {"demo-model", "wheel", "cuda-wheel"}
LANGS = {"check": {"bash", "python"}, "transcript": {"console"}}


@dataclass(frozen=True)
class Block:
    """One marked block: where it is, what kind, its language, its text and its settings."""

    page: str  # path relative to the repository root
    index: int  # 1-based among the page's marked blocks
    line: int  # line of the fence
    kind: str  # "check" or "transcript"
    lang: str
    code: str
    settings: dict[str, str] = field(default_factory=dict)
    masks: tuple[str, ...] = ()
    flags: frozenset[str] = frozenset()

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}"

    @property
    def timeout(self) -> float:
        return float(self.settings.get("timeout", "60"))

    @property
    def needs(self) -> set[str]:
        return set(filter(None, self.settings.get("needs", "").split(",")))

    @property
    def env(self) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in shlex.split(self.settings.get("env", "")))


def parse_settings(text: str, where: str) -> tuple[dict[str, str], tuple[str, ...], frozenset[str]]:
    settings: dict[str, str] = {}
    masks: list[str] = []
    flags: set[str] = set()
    for word in shlex.split(text):
        key, eq, value = word.partition("=")
        if key not in KNOWN:
            raise ValueError(f"{where}: unknown setting {key!r}; expected one of {sorted(KNOWN)}")
        if not eq:
            flags.add(key)
        elif key == "mask":
            re.compile(value)  # a bad regex fails at collection, naming the block
            masks.append(value)
        else:
            settings[key] = value
    bad = set(filter(None, settings.get("needs", "").split(","))) - NEEDS
    if bad:
        raise ValueError(f"{where}: unknown needs {sorted(bad)}; expected some of {sorted(NEEDS)}")
    if settings.get("cwd", "tmp") not in ("tmp", "root"):
        raise ValueError(f"{where}: cwd must be tmp or root, got {settings['cwd']!r}")
    if ("server" in settings) != ("health" in settings):
        raise ValueError(f"{where}: server and health go together")
    return settings, tuple(masks), frozenset(flags)


def page_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The marked blocks of one Markdown file, in order; a marker not followed by a fence is an error."""
    rel = path.relative_to(root).as_posix()
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        if not m:
            i += 1
            continue
        kind, raw = m.group(1), m.group(2)
        where = f"{rel}:{i + 1}"
        j = i + 1
        fence = FENCE.match(lines[j]) if j < len(lines) else None
        if fence is None:
            raise ValueError(f"{where}: a {kind} marker must be followed directly by a code fence")
        ticks, lang = fence.group(1), fence.group(2)
        if lang not in LANGS[kind]:
            raise ValueError(f"{where}: a {kind} block must be one of {sorted(LANGS[kind])}, got {lang!r}")
        end = j + 1
        while end < len(lines) and not lines[end].startswith(ticks):
            end += 1
        if end == len(lines):
            raise ValueError(f"{where}: the code fence is never closed")
        settings, masks, flags = parse_settings(raw, where)
        code = "\n".join(lines[j + 1 : end]) + "\n"
        out.append(Block(rel, len(out) + 1, j + 1, kind, lang, code, settings, masks, flags))
        i = end + 1
    return out


def doc_pages() -> list[Path]:
    """README.md and every page under docs/ (a staging folder `_incoming`, which mkdocs.yml excludes, left out)."""
    pages = [ROOT / "README.md"]
    pages += sorted(p for p in (ROOT / "docs").rglob("*.md") if "_incoming" not in p.parts)
    return pages


def all_blocks() -> list[Block]:
    return [b for page in doc_pages() for b in page_blocks(page)]


def transcript_steps(code: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, expected output lines) pairs."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"a transcript must start with a `$ command` line, got {line!r}")
    return steps


def terminal_lines(text: str) -> list[str]:
    """What a terminal would show: carriage-return rewrites (progress bars) resolved, trailing blanks cut."""
    out = []
    for line in text.split("\n"):
        shown = line.split("\r")[-1].rstrip()
        if shown or "\r" not in line:
            out.append(shown)
    while out and not out[-1]:
        out.pop()
    return out


def masked(lines: list[str], masks: tuple[str, ...]) -> list[str]:
    text = "\n".join(lines)
    for mask in masks:
        text = re.sub(mask, "<masked>", text)
    return text.split("\n")
