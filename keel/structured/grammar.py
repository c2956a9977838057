"""The llguidance adapter: specs -> grammars -> cached matcher templates -> per-request matchers, and the
batch bitmask. Nothing here knows the engine: a spec is a (kind, value) pair, as
`SamplingParams.structured_outputs` gives it."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

# compact JSON (no free whitespace between tokens): a small model cannot wander off into blank lines, and
# the output is what json.dumps(separators=(",", ":")) writes
_JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_text(kind: str, value: Any) -> str:
    """The llguidance grammar of one spec; ValueError("structured_outputs.<kind>: ...") when it is bad."""
    from llguidance import LLMatcher, grammar_from

    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict | bool):
                raise ValueError(f"a JSON schema is an object, got {type(schema).__name__}")
            return str(LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS))  # type: ignore[arg-type]
        if kind == "json_object":
            return str(LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=_JSON_OPTIONS))  # type: ignore[arg-type]
        if kind == "regex":
            return str(LLMatcher.grammar_from_regex(value))
        if kind == "choice":
            return str(grammar_from("choice", json.dumps(list(value))))
        if kind == "grammar":
            return str(grammar_from("grammar", value))  # Lark, or GBNF (converted)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"structured_outputs.{kind}: {exc}") from exc
    raise ValueError(f"structured_outputs: unknown kind {kind!r}; expected json, json_object, regex, choice, grammar")


class GrammarCompiler:
    """One per engine: the llguidance tokenizer (built once from tokenizer.json, about a second), an LRU
    cache of compiled matcher templates keyed by the spec, and the executor that fills batch bitmasks."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token_ids: list[int], cache_size: int = 64) -> None:
        import llguidance

        self.vocab_size = vocab_size
        self._tok = llguidance.LLTokenizer(
            tokenizer_json.read_text(encoding="utf-8"), n_vocab=vocab_size, eos_token=list(eos_token_ids) or None
        )
        self._executor = llguidance.LLExecutor()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # add_request may come from another thread than step (keel serve)
        self.num_compiled = 0  # templates built (cache misses), for tests and metrics

    def matcher(self, kind: str, value: Any) -> Any:
        """A fresh matcher for one request: a copy of the spec's cached template (compiled on first use)."""
        import llguidance

        key = (kind, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                return template.deep_copy()
        grammar = grammar_text(kind, value)
        err = llguidance.LLMatcher.validate_grammar(grammar, self._tok)
        if err and not err.startswith("WARNING"):
            raise ValueError(f"structured_outputs.{kind}: {err}")
        template = llguidance.LLMatcher(self._tok, grammar, log_level=0)
        if template.is_error():
            raise ValueError(f"structured_outputs.{kind}: {template.get_error()}")
        with self._lock:
            self.num_compiled += 1
            self._cache[key] = template
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return template.deep_copy()

    def bitmask(self, matchers: list[Any]) -> torch.Tensor:
        """The allowed-token bitmask [len(matchers), ceil(V/32)] int32 of each matcher's next token."""
        words = (self.vocab_size + 31) // 32
        mask = torch.full((len(matchers), words), -1, dtype=torch.int32)
        # what llguidance.torch.fill_next_token_bitmask_par does, without importing that module (it
        # decorates a kernel with torch.compile at import time, which keel does not use)
        self._executor.unsafe_compute_mask_ptr(
            [(m, i) for i, m in enumerate(matchers)], mask.data_ptr(), words * 4, len(matchers)
        )
        return mask
