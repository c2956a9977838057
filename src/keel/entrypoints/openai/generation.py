"""A generation in flight: its choices' state as the engine's outputs come (`Generation`), and how it is sent
(server-sent events that end however the stream ends: `SSEResponse`, `guarded_events`).

`Generation.outputs` maps a failed sub-request to its error: a request whose own fields leave nothing to
sample is the client's mistake (400 naming the fields), any other failure of the engine a 500.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from keel.engine.async_engine import Drained, EngineDead, RequestStream
from keel.entrypoints.openai.errors import APIError, log
from keel.entrypoints.openai.logprobs import cumulative
from keel.entrypoints.openai.protocol import UsageInfo

if TYPE_CHECKING:
    from keel.entrypoints.openai.serving_engine import OpenAIServing

FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(slots=True)
class Choice:
    """One choice of one prompt: what the engine produced so far for its sub-request."""

    index: int
    prompt_index: int
    prompt_tokens: int
    prompt_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    last_token_s: float | None = None
    logprobs: list[dict[int, Any]] = field(default_factory=list)  # one {token id: Logprob} per output token
    prompt_logprobs: list[dict[int, Any] | None] | None = None  # element 0 is None


@dataclass
class Generation:
    """All sub-requests of one API request, their per-choice state and the stream they come on."""

    serving: OpenAIServing
    request_id: str
    stream: RequestStream
    choices: dict[str, Choice]
    arrival_s: float
    created: int = field(default_factory=lambda: int(time.time()))
    keep: int | None = None  # best_of > n: keep the n candidates of highest cumulative logprob per prompt
    fields: dict[str, str] = field(default_factory=dict)  # engine field -> the request's name (error params)
    _best: list[Choice] | None = None

    async def outputs(self) -> AsyncIterator[tuple[Choice, Any]]:
        """(choice, engine output) pairs, after updating the choice and the server statistics."""
        stats = self.serving.stats
        async for out in self.stream:
            choice = self.choices[out.request_id]
            now = time.perf_counter()
            if out.new_token_ids:
                if choice.last_token_s is None:
                    stats.ttft_s.observe(now - self.arrival_s)
                else:
                    stats.itl_s.observe(now - choice.last_token_s)
                choice.last_token_s = now
            choice.text = out.text
            choice.token_ids = out.token_ids
            choice.completion_tokens = len(out.token_ids)
            if out.logprobs is not None:
                choice.logprobs = out.logprobs
            if out.prompt_logprobs is not None:
                choice.prompt_logprobs = out.prompt_logprobs
            choice.cached_tokens = out.num_cached_tokens or 0
            if out.finished:
                error = getattr(out, "error", None)
                if out.finish_reason == "error" or error is not None:  # this request failed alone
                    raise _failure(out, error, self.fields)
                if out.finish_reason != "stop" and out.finish_reason != "length":
                    raise APIError(503, f"the engine ended the request ({out.finish_reason}); retry later")
                choice.finish_reason = "stop" if out.finish_reason == "stop" else "length"  # checked above
                stats.finished[out.finish_reason] += 1
                stats.e2e_s.observe(now - self.arrival_s)
            yield choice, out

    def usage(self) -> UsageInfo:
        prompts: dict[int, Choice] = {}
        for c in self.choices.values():
            seen = prompts.get(c.prompt_index)
            if seen is None or c.cached_tokens > seen.cached_tokens:
                prompts[c.prompt_index] = c
        prompt_tokens = sum(c.prompt_tokens for c in prompts.values())
        completion = sum(c.completion_tokens for c in self.choices.values())
        cached = sum(c.cached_tokens for c in prompts.values())
        return UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            total_tokens=prompt_tokens + completion,
            prompt_tokens_details={"cached_tokens": cached},
        )

    def ordered(self) -> list[Choice]:
        """The choices in index order; with best_of > n, the n best of each prompt, re-indexed."""
        every = sorted(self.choices.values(), key=lambda c: c.index)
        if self.keep is None:
            return every
        if self._best is not None:
            return self._best
        out: list[Choice] = []
        for p in sorted({c.prompt_index for c in every}):
            cands = [c for c in every if c.prompt_index == p]
            cands.sort(key=lambda c: (-cumulative(c.token_ids, c.logprobs), c.index))
            for rank, c in enumerate(cands[: self.keep]):
                c.index = p * self.keep + rank
                out.append(c)
        self._best = out  # usage still counts every candidate's tokens (they were all generated)
        return out

    def close(self) -> None:
        self.stream.close()


def _failure(out: Any, error: str | None, fields: dict[str, str]) -> APIError:
    """A failed sub-request's error: the client's (its fields leave nothing to sample, its grammar stopped) or
    the engine's."""
    param = getattr(out, "error_param", None)
    if param is not None:
        param = fields.get(param, param)
        return APIError(400, error or "nothing can be sampled for this request", param=param, code="invalid_value")
    return APIError(500, f"the engine failed this request: {error or 'unknown error'}", code="engine_error")


async def disconnected(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


def sse(data: Any) -> str:
    """One server-sent event carrying JSON (a pydantic model or a plain object)."""
    body = data.model_dump_json(exclude_unset=False) if hasattr(data, "model_dump_json") else json.dumps(data)
    return f"data: {body}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class SSEResponse(StreamingResponse):
    """A text/event-stream response that runs `on_close` however it ends (done, error, disconnect)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def guarded_events(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Pass events through; an error after the headers went out becomes an error event, then [DONE]."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield sse(exc.body())
        yield SSE_DONE
    except EngineDead as exc:  # the engine stopped, or a drain ran out of time
        code = "shutting_down" if isinstance(exc, Drained) else "engine_dead"
        yield sse(APIError(503, str(exc), code=code).body())
        yield SSE_DONE
    except Exception as exc:  # the engine failed mid-request: tell the client in the stream
        log.exception("keel serve: engine error while streaming")
        yield sse(APIError(500, f"internal server error: {type(exc).__name__}: {exc}").body())
        yield SSE_DONE
