"""`tokenizer.json` through `tokenizers`, the chat template through jinja2, and streaming detokenization.

`encode_batch` / `decode_batch` are the calls during which `tokenizers` releases the GIL (its single
`encode` / `decode` hold it throughout), so a server can tokenize on a thread without stalling its event
loop; `max_chars_per_token` gives the bound a server checks a text's length against before tokenizing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .fields import FieldReader
from .tokenizer_files import (
    TokenizerError,
    check_ids_fit,
    compile_template,
    load_template,
    load_tokenizers,
    read_json_object,
    token_text,
)

__all__ = ["IncrementalDetokenizer", "Tokenizer", "TokenizerError"]


class Tokenizer:
    """Encode/decode text and render chat templates for one checkpoint folder.

    Everything is checked at construction (tokenizer.json, tokenizer_config.json's special tokens,
    the chat template, which is compiled here, the eos ids), so a broken file fails when the model loads.
    """

    def __init__(self, folder: Path) -> None:
        self._tok, raw = load_tokenizers(folder / "tokenizer.json")
        self._pipeline = {k: raw.get(k) for k in ("normalizer", "pre_tokenizer")} | {"model": _model_info(raw)}
        self._max_chars: int | None = 0  # 0: not computed yet
        model_cfg = read_json_object(folder / "config.json")
        vocab_size = model_cfg.get("vocab_size")
        check_ids_fit(folder / "tokenizer.json", raw, vocab_size)
        cfg_path = folder / "tokenizer_config.json"
        cfg = read_json_object(cfg_path)
        self.bos_token = self._special(cfg, "bos_token", cfg_path)
        self.eos_token = self._special(cfg, "eos_token", cfg_path)
        self.chat_template, where = load_template(folder, cfg)
        self._compiled: Any = None if self.chat_template is None else compile_template(self.chat_template, where)
        vocab = vocab_size if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) else None
        gen_path = folder / "generation_config.json"
        gen = FieldReader(read_json_object(gen_path), str(gen_path), TokenizerError)
        gen.token_ids("bos_token_id", vocab, allow_list=False)
        eos = list(gen.token_ids("eos_token_id", vocab))
        if not eos:  # generation_config.json wins over config.json
            eos = list(
                FieldReader(model_cfg, str(folder / "config.json"), TokenizerError).token_ids("eos_token_id", vocab)
            )
        if self.eos_token is not None:
            eos.append(self._tok.token_to_id(self.eos_token))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))

    def _special(self, cfg: dict[str, Any], key: str, path: Path) -> str | None:
        """A special token of tokenizer_config.json, which must be a token of tokenizer.json."""
        text = token_text(cfg, key, path)
        if text is not None and self._tok.token_to_id(text) is None:
            raise TokenizerError(f"{path}: {key} {text!r} is not a token of tokenizer.json")
        return text

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (adds BOS etc. per `tokenizer.json`'s post-processor)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text; `tokenizers` releases the GIL while it works."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode_batch(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each id list; `tokenizers` releases the GIL while it works."""
        return list(self._tok.decode_batch(seqs, skip_special_tokens=skip_special_tokens))

    def max_chars_per_token(self) -> int | None:
        """The most characters of input one token can stand for, where this tokenizer makes that a bound: a
        BPE model that never fuses unknown characters, behind a normalizer and pre-tokenizer that never drop
        characters; then a text of more than this times N characters is more than N tokens. None otherwise
        (WordPiece's [UNK] stands for a whole word, a stripping normalizer drops any number of characters)."""
        if self._max_chars == 0:
            ok = self._pipeline["model"] and all(
                _keeps_length(self._pipeline[k]) for k in ("normalizer", "pre_tokenizer")
            )
            vocab = self._tok.get_vocab(with_added_tokens=True)
            self._max_chars = max(map(len, vocab), default=1) if ok and vocab else None
        return self._max_chars

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render `messages` with the checkpoint's jinja chat template (as transformers does)."""
        if self.chat_template is None:
            raise TokenizerError(
                "this model has no chat template (tokenizer_config.json or chat_template.jinja); "
                "use plain generation instead"
            )
        return self._compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Template then tokenize; the template already holds the special tokens it wants."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)


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


# normalizers and pre-tokenizers that never remove characters from the text (each may add some)
_KEEPS_LENGTH = frozenset({"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel", "Digits", "Metaspace"})
_SPLIT_KEEPS = frozenset({"isolated", "mergedwithprevious", "mergedwithnext", "contiguous"})  # not "removed"


def _model_info(raw: dict[str, Any]) -> bool:
    """Whether tokenizer.json's model makes each token stand for at most its own vocabulary entry's text."""
    model = raw.get("model")
    return (
        isinstance(model, dict)
        and model.get("type") == "BPE"
        and not (model.get("fuse_unk") and model.get("unk_token"))
    )


def _keeps_length(step: Any) -> bool:
    """Whether a normalizer / pre-tokenizer (tokenizer.json's object, or null) never drops characters."""
    if step is None:
        return True
    if not isinstance(step, dict):
        return False
    kind = step.get("type")
    if kind == "Sequence":
        parts = step.get("normalizers", step.get("pretokenizers"))
        return isinstance(parts, list) and all(_keeps_length(p) for p in parts)
    if kind in ("Split", "Punctuation"):
        return str(step.get("behavior", "isolated")).lower().replace("_", "") in _SPLIT_KEEPS
    if kind == "Replace":
        pattern, content = step.get("pattern"), step.get("content")
        return isinstance(pattern, dict) and "String" in pattern and len(str(content)) >= len(str(pattern["String"]))
    return kind in _KEEPS_LENGTH
