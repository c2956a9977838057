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

from keel.engine.async_engine import AsyncEngine, Drained, EngineDead, Overloaded, RequestStream
from keel.engine.sampling_params import SamplingParams, StructuredOutputsParams
from keel.entrypoints.openai.chat_utils import ChatJob, TemplateError, TemplateRenderer
from keel.entrypoints.openai.errors import APIError, bad_request, log
from keel.entrypoints.openai.logprobs import cumulative
from keel.entrypoints.openai.protocol import SamplingRequest, UsageInfo
from keel.entrypoints.openai.stats import ServerStats
from keel.structured.grammar import GrammarLimits, check_spec

_SEED_SPAN = 2**64
FinishReason = Literal["stop", "length", "tool_calls"]


def param_of(exc: BaseException) -> str | None:
    """The request field an engine error is about: `RequestValidationError.field`, else None."""
    return getattr(exc, "field", None)


class _NoCompiler:
    def release(self, key: Any) -> None:
        pass


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


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
                    raise APIError(
                        500, f"the engine failed this request: {error or 'unknown error'}", code="engine_error"
                    )
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


@dataclass(slots=True)
class ServingConfig:
    """What the generation endpoints need to know about the served model and the server's limits."""

    model_name: str
    max_model_len: int
    vocab_size: int
    max_tokens_limit: int
    trust_request_chat_template: bool = False  # vLLM's --trust-request-chat-template


class OpenAIServing:
    """Shared logic of /v1/completions and /v1/chat/completions."""

    def __init__(
        self, engine: AsyncEngine, tokenizer: Any, config: ServingConfig, templates: TemplateRenderer | None = None
    ) -> None:
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.templates = templates or TemplateRenderer(max_output_chars=max(1 << 20, 16 * config.max_model_len))
        self.grammar_limits = GrammarLimits()
        self.stats = ServerStats()  # what the HTTP layer counts (event-loop side only)
        self.draining = False  # set on SIGTERM / SIGINT: new requests get 503

    def check_chat_template(self, template: str | None) -> None:
        """A request's own chat template runs only where the operator allowed it."""
        if template is not None and not self.config.trust_request_chat_template:
            raise bad_request(
                "chat_template: this server renders only its model's chat template; a request's own template "
                "needs the server started with --trust-request-chat-template",
                "chat_template",
            )

    async def render_template(self, job: ChatJob) -> str:
        """A chat template rendered in a worker process (time, memory and output bounded): a failure is a 400,
        every worker busy past the time limit a 503."""
        try:
            return await self.templates.render(job)
        except TemplateError as exc:
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from exc
        except TimeoutError as exc:
            raise APIError(503, f"{exc}; retry later", code="server_overloaded") from exc

    async def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of `text`, tokenized off the event loop (a long prompt takes a while)."""
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)

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

    def check_token_list(self, ids: list[int] | None, field_name: str) -> None:
        vocab = self.config.vocab_size
        bad = [t for t in ids or [] if not 0 <= t < vocab]
        if bad:
            raise bad_request(
                f"{field_name} has token ids outside [0, {vocab}) (the vocabulary): {bad[:8]}", field_name
            )

    def structured(
        self, req: SamplingRequest, extra: list[tuple[str, dict[str, Any]]] | None = None
    ) -> tuple[str | None, StructuredOutputsParams | None]:
        """The request's one output constraint: (the request field that sets it, StructuredOutputsParams), or
        (None, None). A spec past the grammar limits is refused here, before anything compiles it."""
        try:
            sources = req.structured_sources() + list(extra or [])
        except ValueError as exc:
            raise bad_request(str(exc), "response_format") from exc
        if not sources:
            return None, None
        if len(sources) > 1:
            names = ", ".join(name for name, _ in sources)
            raise bad_request(f"one output constraint per request; this one sets {names}", sources[1][0])
        name, kwargs = sources[0]
        try:
            spec = StructuredOutputsParams(**kwargs)
            check_spec(spec.kind, getattr(spec, spec.kind), self.grammar_limits)
        except (ValueError, TypeError) as exc:
            field = (param_of(exc) or name) if name == "structured_outputs" else name
            raise bad_request(f"{name}: {exc}" if field == name else str(exc), field) from exc
        return name, spec

    def sampling_params(
        self,
        req: SamplingRequest,
        max_tokens: int,
        choice: int,
        *,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        structured: Any = None,
    ) -> Any:
        """The engine's SamplingParams of one choice; a value it refuses is a 400 naming the field."""
        seed = req.seed
        if seed is not None and choice:
            seed = (seed + choice) % _SEED_SPAN  # distinct, reproducible seeds per choice
        top_k = req.top_k or 0
        kwargs: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "top_k": 0 if top_k < 0 else top_k,
            "repetition_penalty": req.repetition_penalty or 1.0,
            "seed": seed,
            "stop": req.stop_list,
            "ignore_eos": req.ignore_eos,
            "min_p": req.min_p or 0.0,
            "presence_penalty": req.presence_penalty or 0.0,
            "frequency_penalty": req.frequency_penalty or 0.0,
            "logit_bias": {int(k): float(v) for k, v in req.logit_bias.items()} if req.logit_bias else None,
            "allowed_token_ids": req.allowed_token_ids,
            "bad_words": req.bad_words or None,
            "stop_token_ids": req.stop_token_ids or None,
            "include_stop_str_in_output": req.include_stop_str_in_output,
            "min_tokens": req.min_tokens,
            "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "skip_special_tokens": req.skip_special_tokens,
            "spaces_between_special_tokens": req.spaces_between_special_tokens,
            "structured_outputs": structured,
        }
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param_of(exc)) from exc

    async def prepare_grammar(self, spec: StructuredOutputsParams, field_name: str | None) -> tuple[Any, Any]:
        """Compile a request's grammar on the grammar workers (big stack, off the engine thread) and pin it
        until the engine has added the request: the request waits for its grammar (at most the compile
        timeout), the batch does not. Returns (compiler, key) to release."""
        grammars = getattr(self.engine.engine, "grammars", None)
        if grammars is None:  # an engine without structured outputs (a test double)
            return _NoCompiler(), None
        compiler = await asyncio.to_thread(grammars)  # built on first use (the llguidance tokenizer, ~1 s)
        kind = spec.kind
        name = field_name or "structured_outputs"
        try:
            future = compiler.prepare(kind, getattr(spec, kind))
        except RuntimeError as exc:
            raise APIError(503, str(exc), code="server_overloaded") from exc
        timeout = self.grammar_limits.compile_timeout_s
        try:
            key = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
        except asyncio.TimeoutError as exc:
            # the worker cannot be interrupted: it finishes in the background, and unpins what it made
            future.add_done_callback(lambda f: f.exception() is None and compiler.release(f.result()))
            raise bad_request(
                f"{name}: the grammar did not compile within this server's limit of {timeout:g} s", name
            ) from exc
        except ValueError as exc:
            raise bad_request(str(exc), param_of(exc) if name == "structured_outputs" else name) from exc
        return compiler, key

    def truncate(self, req: SamplingRequest, ids: list[int]) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the last k prompt tokens (-1: the model's context)."""
        k = req.truncate_prompt_tokens
        if k is None:
            return ids
        k = self.config.max_model_len if k == -1 else k
        if k < 1:
            raise bad_request("truncate_prompt_tokens must be -1 or >= 1", "truncate_prompt_tokens")
        return ids[-k:]

    async def start(
        self,
        prefix: str,
        req: SamplingRequest,
        prompts: list[list[int]],
        params_of: Callable[[int, int], Any],
        constraint: str | None = None,
    ) -> Generation:
        """Admit one sub-request per prompt x candidate (best_of or n); map admission and engine errors.
        `constraint` names the request field of the output constraint (its compile errors' `param`)."""
        if self.draining:
            raise APIError(503, "the server is shutting down; retry on another replica", code="shutting_down")
        arrival = time.perf_counter()
        rid = f"{prefix}-{uuid.uuid4().hex}"
        fan = req.best_of or req.n
        ids, prompt_ids, params, choices = [], [], [], {}
        for p, ptoks in enumerate(prompts):
            for j in range(fan):
                index = p * fan + j
                sub = f"{rid}-{index}"
                ids.append(sub)
                prompt_ids.append(ptoks)
                params.append(params_of(p, j))
                choices[sub] = Choice(index=index, prompt_index=p, prompt_tokens=len(ptoks), prompt_token_ids=ptoks)
        bound = self.engine.max_admitted
        if len(ids) > bound:  # 503 would say "retry later" to a request no retry can ever get admitted
            what = f"n={req.n}" if fan == req.n else f"best_of={fan}"
            raise bad_request(
                f"this request asks for {len(ids)} sequences ({len(prompts)} prompt(s) x {what}); this "
                f"server admits at most {bound} at once (--max-num-seqs + --max-waiting): lower n or send "
                f"fewer prompts per request",
                "n" if fan == req.n else "best_of",
            )
        specs = {p.structured_outputs.key(): p.structured_outputs for p in params if p.structured_outputs is not None}
        prepared = [await self.prepare_grammar(spec, constraint) for spec in specs.values()]
        try:
            stream = await self.engine.open(ids, prompt_ids, params)
        except Overloaded as exc:
            raise APIError(503, str(exc), code="server_overloaded") from exc
        except EngineDead as exc:
            raise APIError(503, str(exc), code="engine_dead") from exc
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param_of(exc)) from exc
        finally:
            for compiler, key in prepared:
                compiler.release(key)  # the engine copied the template (or refused the request)
        gen = Generation(self, f"{prefix}-{req.request_id}" if req.request_id else rid, stream, choices, arrival)
        gen.keep = req.n if fan > req.n else None
        return gen

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
        except EngineDead as exc:  # the engine stopped, or a drain ran out of time
            raise APIError(503, str(exc), code="shutting_down" if isinstance(exc, Drained) else "engine_dead") from exc
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
    except EngineDead as exc:  # the engine stopped, or a drain ran out of time
        code = "shutting_down" if isinstance(exc, Drained) else "engine_dead"
        yield sse(APIError(503, str(exc), code=code).body())
        yield SSE_DONE
    except Exception as exc:  # the engine failed mid-request: tell the client in the stream
        log.exception("keel serve: engine error while streaming")
        yield sse(APIError(500, f"internal server error: {type(exc).__name__}: {exc}").body())
        yield SSE_DONE
