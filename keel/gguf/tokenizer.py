"""Build a Hugging Face ``tokenizer.json`` (byte-level BPE) and its config from GGUF tokenizer metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

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
    kind = gguf.require("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.model is {kind!r}; keel converts only 'gpt2' (byte-level BPE)")
    tokens: list[str] = gguf.require("tokenizer.ggml.tokens")
    merges: list[str] = gguf.require("tokenizer.ggml.merges")
    types: list[int] = gguf.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens[:16]):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens must be an array of strings")
    if len(types) != len(tokens):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.token_type has {len(types)} entries, expected {len(tokens)}")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens has duplicate entries")
    pairs = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise GGUFError(f"{gguf.path}: merge #{i} {merge!r} must be two tokens separated by one space")
        pairs.append((parts[0], parts[1]))

    pre = gguf.get("tokenizer.ggml.pre")
    if pre not in _GPT2_PRE and pre not in _DIGIT_SPLIT_PRE:
        raise GGUFError(
            f"{gguf.path}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer keel does not reproduce; supported: "
            f"{', '.join(SUPPORTED_PRE)} (or absent). Splitting it like GPT-2 would tokenize some text differently"
        )
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    # tokenizers' own stubs omit ByteLevel's keyword arguments, which the Rust class takes
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)  # type: ignore[call-arg]
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
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

    def token_at(key: str) -> tuple[int | None, str | None]:
        idx = gguf.get(key)
        if idx is None:
            return None, None
        if not 0 <= idx < len(tokens):
            raise GGUFError(f"{gguf.path}: {key} = {idx} is outside the vocabulary of {len(tokens)} tokens")
        return idx, tokens[idx]

    bos_id, bos = token_at("tokenizer.ggml.bos_token_id")
    eos_id, eos = token_at("tokenizer.ggml.eos_token_id")
    unk_id, unk = token_at("tokenizer.ggml.unknown_token_id")
    pad_id, pad = token_at("tokenizer.ggml.padding_token_id")
    if gguf.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )

    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("unk_token", unk), ("pad_token", pad)) if v}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(gguf.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(gguf.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length or 1_000_000_000,
        **special,
    }
    template = gguf.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return ConvertedTokenizer(tok, config, special, bos_id, eos_id, pad_id)
