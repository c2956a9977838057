"""Hostile checkpoint files fail with an error naming the file, without reading more than a
bound: a deeply nested or oversized tokenizer.json, a chat_template.jinja that is a link to
/proc/self/pagemap or a FIFO, a model.safetensors link loop."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.bounded_child import RSS_LIMIT, copy_checkpoint, run_child

from keel.hf.tokenizer import Tokenizer, TokenizerError
from keel.hf.weights import INDEX, WeightsError, weight_files

LOAD_TOKENIZER = """
import sys
from pathlib import Path
from keel.hf.errors import CheckpointError
from keel.hf.tokenizer import Tokenizer
try:
    Tokenizer(Path(sys.argv[1]))
except CheckpointError as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
"""


def _tokenizer_refused(folder: Path, *needles: str) -> None:
    child = run_child(LOAD_TOKENIZER, str(folder), timeout=60)
    assert not child.killed and child.peak_rss < RSS_LIMIT, child.describe()
    assert child.rc == 3 and "Traceback" not in child.stderr, child.describe()
    for needle in ("TokenizerError", *needles):
        assert needle in child.stderr, f"{needle!r} not in: {child.describe()}"


def test_nested_tokenizer_json_names_the_file(tiny_hf: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(tiny_hf, tmp_path / "nested")
    (folder / "tokenizer.json").write_text('{"model": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: JSON nested too deeply"):
        Tokenizer(folder)


def test_oversized_tokenizer_json_names_the_file(tiny_hf: Path, tmp_path: Path) -> None:
    """A sparse 600 MB tokenizer.json: refused from its size, not read."""
    folder = copy_checkpoint(tiny_hf, tmp_path / "huge")
    with open(folder / "tokenizer.json", "wb") as fh:
        fh.write(b'{"model": "')
        fh.truncate(600 << 20)
    _tokenizer_refused(folder, str(folder / "tokenizer.json"), "up to")


def test_template_link_to_proc_pagemap_names_the_file(tiny_hf: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(tiny_hf, tmp_path / "pagemap")
    (folder / "chat_template.jinja").symlink_to("/proc/self/pagemap")
    _tokenizer_refused(folder, str(folder / "chat_template.jinja"))


def test_template_fifo_names_the_file(tiny_hf: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(tiny_hf, tmp_path / "fifo")
    os.mkfifo(folder / "chat_template.jinja")
    _tokenizer_refused(folder, str(folder / "chat_template.jinja"), "not a regular file")


def test_oversized_template_names_the_file(tiny_hf: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(tiny_hf, tmp_path / "big_template")
    (folder / "chat_template.jinja").write_text("{{ 'a' }}" * 200_000)
    with pytest.raises(TokenizerError, match=r"chat_template\.jinja holds more than|chat_template\.jinja is \d+ bytes"):
        Tokenizer(folder)


@pytest.mark.parametrize("link", ["loop", "dangling"])
def test_weights_link_names_the_file_not_an_index(tiny_hf: Path, tmp_path: Path, link: str) -> None:
    folder = copy_checkpoint(tiny_hf, tmp_path / link)
    weights = folder / "model.safetensors"
    weights.unlink()
    weights.symlink_to(weights.name if link == "loop" else "absent.safetensors")
    with pytest.raises(WeightsError) as info:
        weight_files(folder)
    message = str(info.value)
    assert str(weights) in message and INDEX not in message, message


def test_index_that_is_not_json_names_it(tiny_hf: Path, tmp_path: Path) -> None:
    folder = copy_checkpoint(tiny_hf, tmp_path / "index")
    (folder / INDEX).write_text("[" * 100_000)
    with pytest.raises(WeightsError, match=INDEX):
        weight_files(folder)
    (folder / INDEX).write_text(json.dumps({"weight_map": {"x": "model.safetensors"}}))
    with pytest.raises(WeightsError, match="whose header does not hold it"):
        weight_files(folder)
