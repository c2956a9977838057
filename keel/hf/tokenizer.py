"""`tokenizer.json` through `tokenizers`, the chat template through jinja2, and streaming detokenization."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """A tokenizer or chat template that is missing or cannot be used."""


def _token_text(value: Any) -> str | None:
    """`tokenizer_config.json` stores special tokens as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"{path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


class Tokenizer:
    """Encode/decode text and render chat templates for one checkpoint folder."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"tokenizer.json not found in {folder}; keel needs a fast (tokenizers) tokenizer")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on parse errors
            raise TokenizerError(f"cannot load {path}: {exc}") from exc
        cfg = _read_json(folder / "tokenizer_config.json")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.chat_template = _load_template(folder, cfg)
        self._compiled: Any = None
        gen = _read_json(folder / "generation_config.json")
        model_cfg = _read_json(folder / "config.json")
        eos: list[int] = []
        for source in (gen.get("eos_token_id"), model_cfg.get("eos_token_id")):
            if source is not None:
                eos += source if isinstance(source, list) else [source]
                break  # generation_config.json wins over config.json
        if self.eos_token is not None and (tid := self._tok.token_to_id(self.eos_token)) is not None:
            eos.append(tid)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(e) for e in eos))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (adds BOS etc. per `tokenizer.json`'s post-processor)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render `messages` with the checkpoint's jinja chat template (as transformers does)."""
        if self.chat_template is None:
            raise TokenizerError(
                "this model has no chat template (tokenizer_config.json or chat_template.jinja); "
                "use plain generation instead"
            )
        if self._compiled is None:
            self._compiled = _compile(self.chat_template)
        return self._compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Template then tokenize; the template already holds the special tokens it wants."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)


def _load_template(folder: Path, cfg: dict[str, Any]) -> str | None:
    """`chat_template.jinja` wins over `tokenizer_config.json`'s `chat_template` (str or named list)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = cfg.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _compile(source: str) -> Any:
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
        raise TokenizerError(f"chat template does not compile: {exc}") from exc


class IncrementalDetokenizer:
    """Turn a stream of token ids into text deltas without splitting multi-byte characters."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], context: int = 4, skip_special_tokens: bool = True
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids[-context:])  # a little prompt context keeps leading spaces right
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text) :]
