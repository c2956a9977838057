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
    tokens: list[str] = gguf.get_list("tokenizer.ggml.tokens", str)
    merges: list[str] = gguf.get_list("tokenizer.ggml.merges", str)
    types: list[int] = gguf.get_list("tokenizer.ggml.token_type", int, default=None) or [TOKEN_NORMAL] * len(tokens)
    if not tokens:
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens is empty; expected the vocabulary")
    if len(types) != len(tokens):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.token_type has {len(types)} entries, expected {len(tokens)}")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.tokens has duplicate entries")
    pairs = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise GGUFError(
                f"{gguf.path}: tokenizer.ggml.merges[{i}] {merge!r} must be two tokens separated by one space"
            )
        pairs.append((parts[0], parts[1]))

    pre = gguf.get_str("tokenizer.ggml.pre", None)
    if pre not in _GPT2_PRE and pre not in _DIGIT_SPLIT_PRE:
        raise GGUFError(
            f"{gguf.path}: tokenizer.ggml.pre is {pre!r}, a pre-tokenizer keel does not reproduce; supported: "
            f"{', '.join(SUPPORTED_PRE)} (or absent). Splitting it like GPT-2 would tokenize some text differently"
        )
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
        idx = gguf.get_int(key, 0, 2**63, default=None)
        if idx is None:
            return None, None
        if not 0 <= idx < len(tokens):
            raise GGUFError(f"{gguf.path}: {key} = {idx} is outside the vocabulary of {len(tokens)} tokens")
        return idx, tokens[idx]

    bos_id, bos = token_at("tokenizer.ggml.bos_token_id")
    eos_id, eos = token_at("tokenizer.ggml.eos_token_id")
    unk_id, unk = token_at("tokenizer.ggml.unknown_token_id")
    pad_id, pad = token_at("tokenizer.ggml.padding_token_id")
    add_bos = gguf.get_bool("tokenizer.ggml.add_bos_token", False)
    add_eos = gguf.get_bool("tokenizer.ggml.add_eos_token", False)
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )

    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("unk_token", unk), ("pad_token", pad)) if v}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
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
    return ConvertedTokenizer(tok, config, special, bos_id, eos_id, pad_id)
