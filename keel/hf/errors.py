"""The one error family of checkpoint loading: every message names the file and the field at fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint file keel cannot use (config, weights, tokenizer, GGUF); the message says which and why."""


def read_json_object_text(
    path: Path, error: type[CheckpointError], missing: str | None = None
) -> tuple[dict[str, Any], str]:
    """The JSON object in `path` and its text, or `error` naming the file and what is wrong with it
    (`missing`, when given, is the message for an absent file)."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except FileNotFoundError as exc:
        raise error(missing or f"cannot read {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text ({exc}); expected a JSON object") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not valid JSON: {exc}") from exc
    except OSError as exc:
        raise error(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data, text
