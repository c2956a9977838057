"""Build a Hugging Face ``tokenizer.json`` (byte-level BPE) and its config from GGUF tokenizer metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from ..hf.tokenizer_files import TokenizerError, compile_template
from .reader import GGUFError, GGUFFile

# token_type values (llama.cpp llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

# tokenizer.ggml.pre values keel reproduces, each with the split llama.cpp applies before BPE:
#   gpt2, default, or absent: the GPT-2 regex (llama.cpp's default for a missing value)
#   smollm: every digit on its own, then the GPT-2 regex (HF: Digits(individual) + ByteLevel)
# Any other value (llama-bpe, qwen2, deepseek-llm, ...) splits differently: refused, never guessed.
_GPT2_PRE = {None, "gpt2", "default"}
_DIGIT_SPLIT_PRE = {"smollm"}
SUPPORTED_PRE = ("gpt2", "default", "smollm")


@dataclass(frozen=True, slots=True)
class ConvertedTokenizer:
    """The ``tokenizers`` object plus the files that sit beside ``tokenizer.json``."""

    tokenizer: Tokenizer
    config: dict[str, Any]
    special_tokens_map: dict[str, Any]
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None


def build_tokenizer(gguf: GGUFFile, max_length: int | None = None) -> ConvertedTokenizer:
    """A GPT-2 style byte-level BPE tokenizer from ``tokenizer.ggml.*``; other models are refused."""
    kind = gguf.get_str("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.model is {kind!r}; keel converts only 'gpt2' (byte-level BPE)")
    tokens, types, pairs = _vocabulary(gguf)
    tok = _byte_level_bpe(gguf, tokens, pairs)
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == TOKEN_CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == TOKEN_USER_DEFINED
        ]
    )
    ids = {name: _token_at(gguf, tokens, f"tokenizer.ggml.{key}") for name, key in _SPECIAL_KEYS.items()}
    bos_id, bos = ids["bos_token"]
    add_bos = gguf.get_bool("tokenizer.ggml.add_bos_token", False)
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    special = {name: text for name, (_, text) in ids.items() if text}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": gguf.get_bool("tokenizer.ggml.add_eos_token", False),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length or 1_000_000_000,
        **special,
    }
    template = gguf.get_str("tokenizer.chat_template", None)
    if template:
        try:  # a broken template fails here, not when the converted model loads
            compile_template(template, f"{gguf.path}: tokenizer.chat_template")
        except TokenizerError as exc:
            raise GGUFError(str(exc)) from None
        config["chat_template"] = template
    return ConvertedTokenizer(tok, config, special, bos_id, ids["eos_token"][0], ids["pad_token"][0])


# special_tokens_map name -> its tokenizer.ggml.* id key
_SPECIAL_KEYS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def _vocabulary(gguf: GGUFFile) -> tuple[list[str], list[int], list[tuple[str, str]]]:
    """The tokens, their types and the merge pairs, checked against each other."""
    tokens: list[str] = gguf.get_list("tokenizer.ggml.tokens", str)
    merges: list[str] = gguf.get_list("tokenizer.ggml.merges", str)
    types: list[int] = gguf.get_list("tokenizer.ggml.token_type", int, default=None) or [TOKEN_NORMAL] * len(tokens)
    if not tokens:
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens is empty; expected the vocabulary")
    if len(types) != len(tokens):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.token_type has {len(types)} entries, expected {len(tokens)}")
    if len(set(tokens)) != len(tokens):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens has duplicate entries")
    pairs = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise GGUFError(
                f"{gguf.path}: tokenizer.ggml.merges[{i}] {merge!r} must be two tokens separated by one space"
            )
        pairs.append((parts[0], parts[1]))
    return tokens, types, pairs


def _byte_level_bpe(gguf: GGUFFile, tokens: list[str], pairs: list[tuple[str, str]]) -> Tokenizer:
    """The BPE model with the pre-tokenizer `tokenizer.ggml.pre` names (refused when keel cannot reproduce it)."""
    pre = gguf.get_str("tokenizer.ggml.pre", None)
    if pre not in _GPT2_PRE and pre not in _DIGIT_SPLIT_PRE:
        raise GGUFError(
            f"{gguf.path}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer keel does not reproduce; supported: "
            f"{', '.join(SUPPORTED_PRE)} (or absent). Splitting it like GPT-2 would tokenize some text differently"
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    except Exception as exc:  # tokenizers raises a bare Exception, e.g. for a merge of unknown tokens
        raise GGUFError(
            f"{gguf.path}: tokenizer.ggml.tokens / tokenizer.ggml.merges do not form a BPE: {exc}"
        ) from None
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    # tokenizers' own stubs omit ByteLevel's keyword arguments, which the Rust class takes
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)  # type: ignore[call-arg]
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    return tok


def _token_at(gguf: GGUFFile, tokens: list[str], key: str) -> tuple[int | None, str | None]:
    """The id and text of the token `key` names, or (None, None) when the file has no such key."""
    idx = gguf.get_int(key, 0, 2**63, default=None)
    if idx is None:
        return None, None
    if not 0 <= idx < len(tokens):
        raise GGUFError(f"{gguf.path}: {key} = {idx} is outside the vocabulary of {len(tokens)} tokens")
    return idx, tokens[idx]
