"""What both generation endpoints share: model check, limits, sampling params, admission, accounting, SSE.

`OpenAIServing.start` turns validated token prompts into engine sub-requests (one per prompt x
choice) and returns a `Generation` that tracks each choice (text, tokens, finish reason, timings)
and feeds the server statistics. `collect` waits for a whole generation while watching for the
client going away; `SSEResponse` closes the generation however the stream ends, so a client that
disconnects mid-stream aborts its requests and frees their KV blocks at once.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from keel.engine.async_engine import AsyncEngine, EngineDead, Overloaded, RequestStream
from keel.entrypoints.openai.errors import APIError, bad_request, log
from keel.entrypoints.openai.protocol import SamplingRequest, UsageInfo
from keel.entrypoints.openai.stats import ServerStats

_SEED_SPAN = 2**64


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


@dataclass(slots=True)
class Choice:
    """One choice of one prompt: what the engine produced so far for its sub-request."""

    index: int
    prompt_index: int
    prompt_tokens: int
    text: str = ""
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: Literal["stop", "length"] | None = None
    last_token_s: float | None = None


@dataclass
class Generation:
    """All sub-requests of one API request, their per-choice state and the stream they come on."""

    serving: OpenAIServing
    request_id: str
    stream: RequestStream
    choices: dict[str, Choice]
    arrival_s: float
    created: int = field(default_factory=lambda: int(time.time()))

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
            choice.completion_tokens = len(out.token_ids)
            choice.cached_tokens = out.num_cached_tokens or 0
            if out.finished:
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
        return sorted(self.choices.values(), key=lambda c: c.index)

    def close(self) -> None:
        self.stream.close()


@dataclass(slots=True)
class ServingConfig:
    """What the generation endpoints need to know about the served model and the server's limits."""

    model_name: str
    max_model_len: int
    vocab_size: int
    max_tokens_limit: int


class OpenAIServing:
    """Shared logic of /v1/completions and /v1/chat/completions."""

    def __init__(self, engine: AsyncEngine, tokenizer: Any, config: ServingConfig) -> None:
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.stats = ServerStats()  # what the HTTP layer counts (event-loop side only)

    def check_model(self, req: SamplingRequest) -> None:
        if req.model != self.config.model_name:
            raise APIError(
                404,
                f"The model `{req.model}` does not exist; this server serves `{self.config.model_name}`",
                param="model",
                code="model_not_found",
            )

    def check_prompt_ids(self, ids: list[int], where: str) -> None:
        vocab = self.config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise bad_request(f"{where} has token ids outside [0, {vocab}) (the vocabulary)", "prompt")

    def max_tokens_for(self, req: SamplingRequest, requested: int | None, prompt_len: int, default: int | None) -> int:
        """Validate the prompt length and max_tokens against the context and the server limit."""
        ctx, cap = self.config.max_model_len, self.config.max_tokens_limit
        if prompt_len >= ctx:
            raise bad_request(
                f"This model's maximum context length is {ctx} tokens, but the prompt has "
                f"{prompt_len} tokens (at most {ctx - 1} fit, with room for one new token)",
                "messages" if hasattr(req, "messages") else "prompt",
            )
        if requested is not None and requested > cap:
            raise bad_request(f"max_tokens is {requested}; this server allows at most {cap}", "max_tokens")
        if requested is not None and prompt_len + requested > ctx:
            raise bad_request(
                f"This model's maximum context length is {ctx} tokens; you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for "
                f"the completion). Lower max_tokens or the prompt.",
                "max_tokens",
            )
        if requested is not None:
            return requested
        room = ctx - prompt_len
        return min(cap, room) if default is None else min(default, cap, room)

    def sampling_params(self, req: SamplingRequest, max_tokens: int, choice: int) -> Any:
        from keel.engine import SamplingParams

        seed = req.seed
        if seed is not None and choice:
            seed = (seed + choice) % _SEED_SPAN  # distinct, reproducible seeds per choice
        top_k = req.top_k or 0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if top_k < 0 else top_k,
            repetition_penalty=req.repetition_penalty or 1.0,
            seed=seed,
            stop=req.stop_list,
            ignore_eos=req.ignore_eos,
        )

    async def start(
        self, prefix: str, req: SamplingRequest, prompts: list[list[int]], max_tokens: list[int]
    ) -> Generation:
        """Admit one sub-request per prompt x choice; map admission and engine errors to API errors."""
        arrival = time.perf_counter()
        rid = f"{prefix}-{uuid.uuid4().hex}"
        ids, prompt_ids, params, choices = [], [], [], {}
        for p, (ptoks, mt) in enumerate(zip(prompts, max_tokens, strict=True)):
            for j in range(req.n):
                index = p * req.n + j
                sub = f"{rid}-{index}"
                ids.append(sub)
                prompt_ids.append(ptoks)
                params.append(self.sampling_params(req, mt, j))
                choices[sub] = Choice(index=index, prompt_index=p, prompt_tokens=len(ptoks))
        bound = self.engine.max_admitted
        if len(ids) > bound:  # 503 would say "retry later" to a request no retry can ever get admitted
            raise bad_request(
                f"this request asks for {len(ids)} sequences ({len(prompts)} prompt(s) x n={req.n}); this "
                f"server admits at most {bound} at once (--max-num-seqs + --max-waiting): lower n or send "
                f"fewer prompts per request",
                "n",
            )
        try:
            stream = await self.engine.open(ids, prompt_ids, params)
        except Overloaded as exc:
            raise APIError(503, str(exc), code="server_overloaded") from exc
        except EngineDead as exc:
            raise APIError(503, str(exc), code="engine_dead") from exc
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc)) from exc
        return Generation(self, rid, stream, choices, arrival)

    async def respond(
        self,
        raw: Request,
        req: SamplingRequest,
        gen: Generation,
        events: Callable[[], AsyncIterator[str]],
        body: Callable[[], Any],
    ) -> Response:
        """The answer: SSE from `events()` when streaming, else `body()` once the generation is complete."""
        if req.stream:
            return SSEResponse(guarded_events(events()), gen.close)
        try:
            await self.collect(raw, gen)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client is gone
        return JSONResponse(body().model_dump())

    async def collect(self, raw: Request, gen: Generation) -> None:
        """Run `gen` to the end; abort it (ClientGone) if the client disconnects first."""

        async def consume() -> None:
            async for _ in gen.outputs():
                pass

        work = asyncio.ensure_future(consume())
        gone = asyncio.ensure_future(_disconnected(raw))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
            gen.close()
        if not work.done() or work.cancelled():
            raise ClientGone()
        work.result()  # re-raise engine / API errors


async def _disconnected(raw: Request) -> None:
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
    except EngineDead as exc:
        yield sse(APIError(503, str(exc)).body())
        yield SSE_DONE
    except Exception as exc:  # the engine failed mid-request: tell the client in the stream
        log.exception("keel serve: engine error while streaming")
        yield sse(APIError(500, f"internal server error: {type(exc).__name__}: {exc}").body())
        yield SSE_DONE
