"""`SamplingParams`: how one request samples and when it stops (field names follow vLLM's), and
`StructuredOutputsParams`: the grammar a request's output must follow."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from keel.engine.errors import RequestValidationError
from keel.layers.sampler import SAMPLING_EPS

MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MAX_BAD_WORDS = 128  # bad_words per request
MAX_BAD_WORD_CHARS = 128  # characters of one bad word
MAX_STOP_CHARS = 256  # characters of one stop string (the stream holds back as many while one may form)
# Multiplying or dividing a seen token's logit by at most 100 keeps every float32 logit below 1e4 finite
# (and far from the 3.4e38 ceiling after a temperature >= SAMPLING_EPS); the range covers every use
# (vLLM and transformers suggest 1.0-2.0). Below it the division overflows: 1e-300 is 0 in float32.
REPETITION_PENALTY_RANGE = (1e-2, 100.0)
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass(slots=True)
class StructuredOutputsParams:
    """Exactly one constraint: a JSON schema (`json`, str or dict), any JSON object (`json_object`), a
    regular expression the whole output matches (`regex`), one of `choice`, or a Lark grammar (`grammar`)."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        given = [name for name in self.kinds() if self._value(name) not in (None, False)]
        if len(given) != 1:
            raise RequestValidationError(
                "structured_outputs",
                f"StructuredOutputsParams: exactly one of json, regex, choice, grammar, json_object must be set, "
                f"got {given or 'none'}",
            )
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise RequestValidationError(
                "structured_outputs.choice",
                "StructuredOutputsParams: choice must be a non-empty list of non-empty strings",
            )

    @staticmethod
    def kinds() -> tuple[str, ...]:
        return ("json", "regex", "choice", "grammar", "json_object")

    def _value(self, name: str) -> Any:
        return getattr(self, name)

    @property
    def kind(self) -> str:
        """The field that is set."""
        return next(n for n in self.kinds() if self._value(n) not in (None, False))

    def key(self) -> tuple[str, str]:
        """A hashable spec (the compiled-grammar cache key)."""
        value = self._value(self.kind)
        if isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        return self.kind, str(value)


@dataclass(slots=True)
class SamplingParams:
    """Sampling and stopping controls; temperature 0 (or anything below SAMPLING_EPS, 1e-5) means greedy
    (keel's default, deterministic). Every extra control defaults to off; a request that uses none of them
    samples exactly as before. A value out of range raises RequestValidationError naming the field."""

    max_tokens: int = 64  # 0 only for scoring requests (prompt_logprobs set): prefill, no output token
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0: off; else drop tokens with probability < min_p * the top token's
    repetition_penalty: float = 1.0  # 1.0: off; >1 discourages tokens already in prompt or output
    presence_penalty: float = 0.0  # OpenAI: logits -= presence_penalty * (count > 0) over output tokens
    frequency_penalty: float = 0.0  # OpenAI: logits -= frequency_penalty * count over output tokens
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (clipped to [-100, 100])
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # words never generated (their token sequences are blocked)
    # bad_words' token sequences, tokenized once per request (`bad_words_token_ids`); None: the engine does it
    bad_words_token_ids: list[list[int]] | None = None
    seed: int | None = None  # per-request generator; None: torch's global RNG
    stop: list[str] = field(default_factory=list)  # stop strings, excluded from the returned text
    stop_token_ids: list[int] | None = None  # tokens that end the request like eos
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) in the text
    ignore_eos: bool = False  # for benchmarks: always produce max_tokens
    min_tokens: int = 0  # eos and stop_token_ids are masked (and stop strings unchecked) before this many
    logprobs: int | None = None  # None: none; k: the sampled token's logprob plus the top k (k <= 20)
    prompt_logprobs: int | None = None  # the same for every prompt token (the first has none)
    skip_special_tokens: bool = True  # leave special tokens out of the text
    spaces_between_special_tokens: bool = True  # accepted for vLLM parity; tokenizer.json decoders ignore it
    structured_outputs: StructuredOutputsParams | None = None
    n: int = 1  # completions returned per prompt (LLM.generate)
    best_of: int | None = None  # candidates sampled per prompt (None: n); the n of highest cumulative logprob

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        _check_int("max_tokens", self.max_tokens, 0)
        if self.max_tokens == 0 and self.prompt_logprobs is None:
            _fail(
                "max_tokens",
                "SamplingParams: max_tokens must be >= 1, got 0 (0 is allowed only for scoring requests, "
                "with prompt_logprobs set)",
            )
        # finite as the sampler's float32 too: the logits are divided by it (tiny values are greedy, below)
        if not 0 <= self.temperature <= _FLOAT32_MAX:
            _fail("temperature", f"SamplingParams: temperature must be >= 0 and finite, got {self.temperature}")
        _check_int("top_k", self.top_k, 0, "(0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            _fail("top_p", f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            _fail("min_p", f"SamplingParams: min_p must be in [0, 1], got {self.min_p}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            _fail(
                "repetition_penalty",
                f"SamplingParams: repetition_penalty must be in [{low:g}, {high:g}] (1 = off), "
                f"got {self.repetition_penalty}",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                _fail(name, f"SamplingParams: {name} must be in [-2, 2], got {value}")
        if any(not s for s in self.stop):
            _fail("stop", "SamplingParams: stop strings must be non-empty")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            _fail("stop", f"SamplingParams: a stop string may have at most {MAX_STOP_CHARS} characters")
        self._check_token_fields()
        self._check_bad_words()
        self._check_counts()

    def _check_token_fields(self) -> None:
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError, OverflowError) as exc:
                raise RequestValidationError(
                    "logit_bias", f"SamplingParams: logit_bias must map token ids to numbers, got {self.logit_bias!r}"
                ) from exc
            if any(k < 0 for k in self.logit_bias) or any(math.isnan(v) for v in self.logit_bias.values()):
                _fail("logit_bias", "SamplingParams: logit_bias keys must be token ids >= 0 and values numbers")
            if not all(math.isfinite(v) for v in self.logit_bias.values()):
                _fail(
                    "logit_bias",
                    "SamplingParams: logit_bias values must be finite (they are clipped to [-100, 100]), "
                    f"got {sorted({v for v in self.logit_bias.values() if not math.isfinite(v)})}",
                )
        for name in ("allowed_token_ids", "stop_token_ids"):
            ids = getattr(self, name)
            if ids is not None:
                if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                    _fail(name, f"SamplingParams: {name} must be a list of token ids >= 0, got {ids!r}")
                setattr(self, name, list(ids))
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            _fail("allowed_token_ids", "SamplingParams: allowed_token_ids must not be empty (None: every token)")

    def _check_counts(self) -> None:
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not -(1 << 63) <= self.seed < 1 << 64
        ):
            _fail(
                "seed", f"SamplingParams: seed must be an integer in [-2**63, 2**64) (None = random), got {self.seed!r}"
            )
        _check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens and self.min_tokens > self.max_tokens:
            _fail(
                "min_tokens",
                f"SamplingParams: min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None:
                _check_int(name, k, 0, f"and <= {MAX_LOGPROBS} (None = off)")
                if k > MAX_LOGPROBS:
                    _fail(name, f"SamplingParams: {name} must be in [0, {MAX_LOGPROBS}] (None = off), got {k}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            _fail(
                "structured_outputs",
                "SamplingParams: structured_outputs must be a StructuredOutputsParams, "
                f"got {type(self.structured_outputs).__name__}",
            )
        _check_int("n", self.n, 1)
        if self.best_of is not None:
            _check_int("best_of", self.best_of, 1)
            if self.best_of < self.n:
                _fail("best_of", f"SamplingParams: best_of must be >= n ({self.n}), got {self.best_of}")
        if self.max_tokens == 0 and self.num_candidates > 1:
            _fail("n", "SamplingParams: n and best_of must be 1 for a scoring request (max_tokens=0)")

    def _check_bad_words(self) -> None:
        seqs = self.bad_words_token_ids
        if seqs is not None and not all(
            s and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in s) for s in seqs
        ):
            _fail("bad_words", "SamplingParams: bad_words_token_ids must be non-empty lists of token ids >= 0")
        words = self.bad_words
        if words is None:
            return
        if not all(isinstance(w, str) and w.strip() for w in words):
            _fail("bad_words", f"SamplingParams: bad_words must be non-empty strings, got {words!r}"[:300])
        if len(words) > MAX_BAD_WORDS:
            _fail("bad_words", f"SamplingParams: at most {MAX_BAD_WORDS} bad_words, got {len(words)}")
        longest = max(map(len, words), default=0)
        if longest > MAX_BAD_WORD_CHARS:
            _fail(
                "bad_words",
                f"SamplingParams: a bad word may have at most {MAX_BAD_WORD_CHARS} characters, got one of {longest}",
            )

    @property
    def greedy(self) -> bool:
        """Argmax sampling: temperature 0, or below SAMPLING_EPS (vLLM's rule: dividing the logits by a
        tinier temperature overflows float32)."""
        return self.temperature < SAMPLING_EPS

    @property
    def num_candidates(self) -> int:
        """Sequences sampled per prompt: best_of, or n."""
        return self.best_of if self.best_of is not None else self.n


def _fail(name: str, message: str) -> NoReturn:
    raise RequestValidationError(name, message)


def _check_int(name: str, value: Any, low: int, extra: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        _fail(name, f"SamplingParams: {name} must be an integer >= {low}{' ' + extra if extra else ''}, got {value!r}")


def bad_words_token_ids(words: list[str], encode_batch: Callable[[list[str]], list[list[int]]]) -> list[list[int]]:
    """Token sequences that `words` forbid: each word alone and after a space (vLLM's rule: the spaced form
    only when it is a different first token of the same length). `encode_batch` tokenizes a list of texts
    without special tokens, in one call."""
    stripped = [w.lstrip() for w in words]
    encoded = encode_batch(stripped + [" " + w for w in stripped])
    out: list[list[int]] = []
    for plain, spaced in zip(encoded[: len(words)], encoded[len(words) :], strict=True):
        if plain:
            out.append(list(plain))
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(list(spaced))
    return out
