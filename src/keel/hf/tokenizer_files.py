"""Reading a checkpoint's tokenizer files with errors that name the file and the field or component."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import MAX_TEMPLATE_BYTES, MAX_TOKENIZER_BYTES, CheckpointError, read_json_object_text, read_text_bounded


class TokenizerError(CheckpointError):
    """A tokenizer or chat template that is missing or cannot be used."""


# tokenizer.json's top-level components, each parsed on its own to say which one is broken
_COMPONENTS = (
    "model",
    "added_tokens",
    "normalizer",
    "pre_tokenizer",
    "post_processor",
    "decoder",
    "truncation",
    "padding",
    "version",
)
_BASE: dict[str, Any] = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": None,
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"},
}


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when the (optional) file is absent."""
    return _read_object_text(path)[0] if path.exists() or path.is_symlink() else {}


def _read_object_text(path: Path, limit: int | None = None) -> tuple[dict[str, Any], str]:
    if limit is None:
        return read_json_object_text(path, TokenizerError)
    return read_json_object_text(path, TokenizerError, limit=limit)


def load_tokenizers(path: Path) -> tuple[Any, dict[str, Any]]:
    """The `tokenizers.Tokenizer` of tokenizer.json and its parsed JSON; a broken one names its component."""
    from tokenizers import Tokenizer as HFTokenizer

    if not (path.exists() or path.is_symlink()):
        raise TokenizerError(f"tokenizer.json not found in {path.parent}; keel needs a fast (tokenizers) tokenizer")
    raw, text = _read_object_text(path, MAX_TOKENIZER_BYTES)
    try:
        return HFTokenizer.from_str(text), raw
    except Exception as exc:  # tokenizers raises a bare Exception on parse errors
        reason = str(exc)
    for key in _COMPONENTS:
        if key not in raw:
            continue
        try:
            HFTokenizer.from_str(json.dumps(_BASE | {key: raw[key]}))
        except Exception as exc:
            raise TokenizerError(f"{path}: '{key}' is not a valid tokenizers {key}: {exc}") from None
    if "model" not in raw:
        raise TokenizerError(f"{path}: 'model' is missing; expected the tokenizer model (BPE, WordPiece, ...)")
    raise TokenizerError(f"{path}: cannot load it ({reason}); each component parses alone, so they disagree")


def check_ids_fit(path: Path, raw: dict[str, Any], vocab_size: Any) -> None:
    """Token ids of tokenizer.json are unique in its vocab and each has an embedding row (config.json vocab_size)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        return  # config.json reports its own errors
    model = raw.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids: list[tuple[int, Any, str]] = []
    if isinstance(vocab, dict):
        ids += [(i, t, "model.vocab") for t, i in vocab.items() if isinstance(i, int)]
        owner: dict[int, str] = {}
        for i, t, _ in ids:
            if owner.setdefault(i, t) != t:
                raise TokenizerError(f"{path}: model.vocab gives id {i} to both {owner[i]!r} and {t!r}")
    added = raw.get("added_tokens")
    if isinstance(added, list):
        ids += [
            (a["id"], a.get("content"), "added_tokens")
            for a in added
            if isinstance(a, dict) and isinstance(a.get("id"), int)
        ]
    if ids:
        top, token, where = max(ids, key=lambda x: x[0])
        if top >= vocab_size:
            raise TokenizerError(
                f"{path}: token {token!r} ({where}) has id {top}, outside config.json vocab_size {vocab_size}: "
                "the model has no embedding for it"
            )


def token_text(cfg: dict[str, Any], key: str, file: Path) -> str | None:
    """A special token of tokenizer_config.json: a string, an AddedToken object with a string content, or null."""
    value = cfg.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(
        f"{file}: {key} must be a string, an object with a string 'content', or null; got {value!r:.60}"
    )


def load_template(folder: Path, cfg: dict[str, Any]) -> tuple[str | None, str]:
    """The chat template and where it came from: `chat_template.jinja` wins over tokenizer_config.json's
    `chat_template` (a string, or a list of {name, template} with a 'default')."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.exists() or jinja_file.is_symlink():  # a dangling or looping link is an error too
        return read_text_bounded(jinja_file, TokenizerError, MAX_TEMPLATE_BYTES), str(jinja_file)
    where = f"{folder / 'tokenizer_config.json'}: chat_template"
    template = cfg.get("chat_template")
    if isinstance(template, list):
        named = {}
        for t in template:
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)):
                raise TokenizerError(
                    f"{where} entries must be objects with string 'name' and 'template', got {t!r:.60}"
                )
            named[t["name"]] = t["template"]
        template = named.get("default") or next(iter(named.values()), None)
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{where} must be a string, a list of named templates, or null; got {template!r:.60}")
    return template, where


def compile_template(source: str, where: str) -> Any:
    """Compile a template in the sandbox, with the helpers transformers provides to templates."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise TokenizerError(f"{where}: the chat template does not compile: {exc}") from exc
