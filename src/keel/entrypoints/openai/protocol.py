"""Pydantic models shared by the endpoints: the request base, sampling fields, usage, errors.

Requests mirror OpenAI's schema plus vLLM's extension fields (same names, same meaning). Unknown
fields are refused (400, as OpenAI and vLLM do); fields keel accepts but does not act on (`user`,
`metadata`, ...) are listed as such; fields keel cannot honour (`use_beam_search`, `suffix`, ...)
are accepted only at their defaults and refused otherwise with the reason (`REFUSED`), so a
client never silently gets something other than what it asked for. README "Request fields" lists
every field with its status.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from keel.entrypoints.openai.errors import bad_request

MAX_N = 16  # choices per request
MAX_STOP = 16  # stop strings per request
MAX_LOGPROBS = 20  # top logprobs per token (OpenAI's and vLLM's default limit)


def invalid_unicode_at(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or object key) in `value` that is not valid Unicode (a lone
    surrogate such as "\\ud800", which JSON can carry but UTF-8 cannot), or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return where or "body"
        elif isinstance(item, dict):
            for k, v in item.items():
                key = f"{where}.{k}" if where else str(k)
                if isinstance(k, str) and invalid_unicode_at(k) is not None:
                    return (where + "." if where else "") + "<key>"
                stack.append((v, key))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}.{i}" if where else str(i)) for i, v in enumerate(item))
    return None


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        # a lone surrogate would fail later (tokenizer, logs, JSON answer) as a 500: refuse it here, naming
        # the field (an APIError is not a ValueError, so pydantic lets it through to the 400 handler)
        where = invalid_unicode_at(data)
        if where is not None:
            raise bad_request(
                f"{where}: the text is not valid Unicode (it holds a lone UTF-16 surrogate such as \\ud800)", where
            )
        return data


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM: usage in every chunk (needs include_usage)
    include_obfuscation: bool | None = None  # accepted, ignored (keel adds no obfuscation padding)


class StructuredOutputsRequest(OpenAIBaseModel):
    """vLLM's `structured_outputs` object (exactly one constraint)."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _is_default(value: Any) -> bool:
    return value in (None, False, 0, 0.0, [], {}, "none", "auto") or value == {"type": "text"}


# vLLM (or OpenAI) fields keel refuses at non-default values, with the reason given to the client
REFUSED_COMMON: dict[str, str] = {
    "use_beam_search": "keel has no beam search",
    "length_penalty": "it applies to beam search, which keel does not have",
    "priority": "keel schedules first come, first served (no priority scheduling)",
    "logits_processors": "keel runs no user-supplied logits processors",
    "cache_salt": "keel's prefix cache has no per-request salt",
    "kv_transfer_params": "keel has no KV transfer (disaggregated prefill)",
    "vllm_xargs": "keel takes no extra engine arguments per request",
    "guided_whitespace_pattern": "keel's grammar engine uses its default whitespace rule",
}


class SamplingRequest(OpenAIBaseModel):
    """The sampling / stopping fields of both endpoints, with OpenAI's and vLLM's defaults and ranges."""

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    max_tokens: int | None = Field(default=None, ge=0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # accepted and ignored: they change nothing about the output
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's sampling extensions
    best_of: int | None = Field(default=None, ge=1, le=MAX_N)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    # vLLM's structured outputs (the guided_* names are its older spelling)
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM fields keel refuses at non-default values (REFUSED_COMMON says why)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    priority: int = 0
    logits_processors: list[Any] | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    REFUSED: ClassVar[dict[str, str]] = REFUSED_COMMON

    @model_validator(mode="after")
    def _check(self) -> SamplingRequest:
        for name, reason in self.REFUSED.items():
            value = getattr(self, name)
            if name == "length_penalty" and value == 1.0:
                continue
            if not _is_default(value):
                raise ValueError(f"{name} is not supported by keel serve: {reason} (only its default is accepted)")
        stops = self.stop_list
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop takes at most {MAX_STOP} strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        so = self.stream_options
        if so is not None and so.continuous_usage_stats and not so.include_usage:
            raise ValueError("stream_options.continuous_usage_stats needs stream_options.include_usage: true")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of must be >= n, got best_of={self.best_of} and n={self.n}")
        if self.best_of is not None and self.best_of > self.n and self.stream:
            raise ValueError("best_of > n is not allowed with stream: true (the best are known only at the end)")
        if self.guided_decoding_backend not in (None, "auto", "xgrammar", "guidance", "outlines"):
            raise ValueError(f"guided_decoding_backend {self.guided_decoding_backend!r} is not a known backend")
        return self

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            # ASCII digits only: "²".isdigit() is true, and int("²") fails
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f'keys must be token ids (ASCII decimal strings such as "42"), got {key!r}')
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"values must be in [-100, 100], got {bias} for token {key}")
        return value

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(
            self.stream_options and self.stream_options.include_usage and self.stream_options.continuous_usage_stats
        )

    def sampling_fields(
        self, *, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None
    ) -> dict[str, Any]:
        """The engine's SamplingParams fields of this request (its route gives what its API spells its own way)."""
        top_k = self.top_k or 0
        return {
            "max_tokens": max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": 0 if top_k < 0 else top_k,
            "repetition_penalty": self.repetition_penalty or 1.0,
            "seed": self.seed,
            "stop": self.stop_list,
            "ignore_eos": self.ignore_eos,
            "min_p": self.min_p or 0.0,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "logit_bias": {int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias else None,
            "allowed_token_ids": self.allowed_token_ids,
            "bad_words": self.bad_words or None,
            "stop_token_ids": self.stop_token_ids or None,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "min_tokens": self.min_tokens,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
        }

    def structured_sources(self) -> list[tuple[str, dict[str, Any]]]:
        """Every constraint the request sets, as (field name, StructuredOutputsParams kwargs)."""
        found: list[tuple[str, dict[str, Any]]] = []
        rf = self.response_format
        if rf is not None:
            kind = rf.get("type")
            if kind == "json_object":
                found.append(("response_format", {"json_object": True}))
            elif kind == "json_schema":
                spec = rf.get("json_schema")
                if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
                    raise ValueError("response_format.json_schema must be an object with a `schema` object")
                found.append(("response_format", {"json": spec.get("schema", {})}))
            elif kind != "text":
                raise ValueError(
                    f"response_format.type must be one of text, json_object, json_schema; got {kind!r}"
                    + (" (structural tags are not supported by keel serve)" if kind == "structural_tag" else "")
                )
        so = self.structured_outputs
        if so is not None:
            for name in ("structural_tag", "whitespace_pattern"):
                if getattr(so, name) is not None:
                    raise ValueError(f"structured_outputs.{name} is not supported by keel serve")
            for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
                if getattr(so, name):
                    raise ValueError(f"structured_outputs.{name} is not supported by keel serve")
            kw = {
                k: v
                for k, v in (
                    ("json", so.json_),
                    ("regex", so.regex),
                    ("choice", so.choice),
                    ("grammar", so.grammar),
                    ("json_object", so.json_object or None),
                )
                if v is not None
            }
            if len(kw) != 1:
                raise ValueError(
                    "structured_outputs takes exactly one of json, regex, choice, grammar, json_object; "
                    f"got {sorted(kw) or 'none'}"
                )
            found.append(("structured_outputs", kw))
        for name, key in (
            ("guided_json", "json"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            value = getattr(self, name)
            if value is not None:
                if name == "guided_json" and isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"guided_json is not valid JSON: {exc}") from exc
                found.append((name, {key: value}))
        return found


class UsageInfo(ResponseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None  # {"cached_tokens": n} from the prefix cache


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class ModelCard(ResponseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "keel"
    max_model_len: int | None = None


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
