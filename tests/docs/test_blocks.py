"""The parser of marked doc blocks (blocks.py): what it takes, what it refuses, how transcripts compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from docs.blocks import masked, page_blocks, terminal_lines, transcript_steps


@pytest.fixture
def page(tmp_path: Path):
    def make(text: str) -> Path:
        p = tmp_path / "page.md"
        p.write_text(text)
        return p

    return make


def test_only_marked_blocks_are_taken(page):
    p = page(
        '```bash\nnot run\n```\n\n<!-- check: timeout=5 needs=demo-model env="A=1 B=2" slow -->\n```bash\necho hi\n```\n'
        '<!-- transcript: mask="\\d+ s" mask="x" -->\n```console\n$ echo 1\n1\n```\n'
    )
    check, transcript = page_blocks(p, p.parent)
    assert (check.kind, check.lang, check.code, check.index) == ("check", "bash", "echo hi\n", 1)
    assert check.timeout == 5 and check.needs == {"demo-model"} and check.env == {"A": "1", "B": "2"}
    assert "slow" in check.flags
    assert (transcript.kind, transcript.index, transcript.masks) == ("transcript", 2, (r"\d+ s", "x"))
    assert check.id.endswith("#1") and transcript.id.endswith("#2")


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!-- check: timeout=5 -->\n\n```bash\necho\n```\n", "followed directly by a code fence"),
        ("<!-- check: colour=red -->\n```bash\necho\n```\n", "unknown setting 'colour'"),
        ("<!-- check: needs=gpu -->\n```bash\necho\n```\n", "unknown needs"),
        ("<!-- transcript: -->\n```bash\necho\n```\n", "must be one of ['console']"),
        ("<!-- check: -->\n```bash\necho\n", "never closed"),
        ('<!-- transcript: mask="(" -->\n```console\n$ x\n```\n', "missing"),
    ],
)
def test_bad_markers_fail_naming_the_block(page, text: str, message: str):
    p = page(text)
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        page_blocks(p, p.parent)


def test_transcript_steps_and_masks():
    steps = transcript_steps("$ keel generate\nkeel: 8 tokens in 0.57 s\n$ echo $?\n0\n")
    assert steps == [("keel generate", ["keel: 8 tokens in 0.57 s"]), ("echo $?", ["0"])]
    shown, now = ["keel: 8 tokens in 0.57 s"], ["keel: 8 tokens in 12.0 s"]
    assert masked(shown, (r"in [0-9.]+ s",)) == masked(now, (r"in [0-9.]+ s",))
    assert masked(["The capital is Paris."], ()) != masked(["The capital is Lyon."], ())  # a stale line fails


def test_progress_bars_are_resolved_as_a_terminal_shows_them():
    out = "loading  10%|#\rloading 100%|##########\r            \rkeel: done\nanswer\n\n"
    assert terminal_lines(out) == ["keel: done", "answer"]
