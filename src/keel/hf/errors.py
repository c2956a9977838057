"""The one error family of checkpoint loading: every message names the file and the field at fault."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# bytes a checkpoint's text files may hold: far above released models (SmolLM2's tokenizer.json is 2 MB, the
# largest multilingual ones about 35 MB); past them a file is damaged or hostile, and parsing it would cost GBs
MAX_JSON_BYTES = 64 << 20  # config.json, tokenizer_config.json, generation_config.json, the shard index
MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json
MAX_TEMPLATE_BYTES = 1 << 20  # chat_template.jinja


class CheckpointError(ValueError):
    """A checkpoint file keel cannot use (config, weights, tokenizer, GGUF); the message says which and why."""


def read_bytes_bounded(path: Path, error: type[CheckpointError], limit: int, missing: str | None = None) -> bytes:
    """The bytes of the regular file `path` (links are followed: a Hugging Face cache snapshot is links), at
    most `limit` of them, or `error` naming the file: absent, not a regular file (a device, a FIFO, a
    directory), larger than `limit` (also one whose size says 0, such as /proc files), unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise error(missing or f"cannot read {path}: {exc.strerror}") from None
    except OSError as exc:
        raise error(f"cannot open {path} ({exc.strerror or exc}); expected a readable regular file") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path} is not a regular file; expected a file of the checkpoint")
        if info.st_size > limit:
            raise error(f"{path} is {info.st_size} bytes; keel reads such a file up to {limit} bytes")
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise error(f"{path} holds more than {limit} bytes; keel reads such a file up to {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise error(f"cannot read {path} ({exc.strerror or exc}); expected a readable regular file") from None
    finally:
        os.close(fd)


def read_text_bounded(path: Path, error: type[CheckpointError], limit: int, missing: str | None = None) -> str:
    """`read_bytes_bounded` decoded as UTF-8 (an error naming the file when it is not)."""
    raw = read_bytes_bounded(path, error, limit, missing)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text ({exc})") from None


def read_json_object_text(
    path: Path, error: type[CheckpointError], missing: str | None = None, limit: int = MAX_JSON_BYTES
) -> tuple[dict[str, Any], str]:
    """The JSON object in `path` and its text, or `error` naming the file and what is wrong with it
    (`missing`, when given, is the message for an absent file; `limit`: the most bytes it may hold)."""
    raw = read_bytes_bounded(path, error, limit, missing)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text ({exc}); expected a JSON object") from None
    del raw
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply for keel's parser; expected a checkpoint file") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data, text
