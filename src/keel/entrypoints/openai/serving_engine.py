"""The one request path of every generation route.

A route converts its request into an `EngineRequest`: prompts (text, or token ids), the engine's sampling
fields, candidates per prompt and output constraints, nothing of its API's shape. `OpenAIServing.generate`
then runs every check the routes share (model, token lists, limits, logprob rules, the structured-output
source, the bounds on untrusted input), tokenizes off the event loop, compiles the grammar in a sandbox,
admits one engine sub-request per prompt x candidate and returns the `Generation` the route answers from
(`respond`: whole, or as server-sent events). Checks that cost nothing run before anything that costs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from keel.engine.async_engine import AsyncEngine, Drained, EngineDead, Overloaded
from keel.engine.sampling_params import SamplingParams, StructuredOutputsParams
from keel.entrypoints.openai.chat_utils import ChatJob, TemplateError, TemplateRenderer
from keel.entrypoints.openai.errors import APIError, bad_request
from keel.entrypoints.openai.generation import Choice, Generation, SSEResponse, disconnected, guarded_events
from keel.entrypoints.openai.protocol import SamplingRequest
from keel.entrypoints.openai.stats import ServerStats
from keel.entrypoints.openai.tokenizing import TokenizerPool
from keel.structured.grammar import Compile, GrammarBusy, GrammarLimits, check_spec

_SEED_SPAN = 2**64


def param_of(exc: BaseException) -> str | None:
    """The request field an engine error is about: `RequestValidationError.field`, else None."""
    return getattr(exc, "field", None)


def client_of(raw: Request) -> str | None:
    """Who sends a request, for the engine's per-client shares: the API key it was admitted with (a digest of
    it, so no secret is kept), else the connection's peer address. A bearer token the server does not check
    names nobody (clients send placeholders such as "EMPTY"), so without a server key the peer decides."""
    serving = getattr(raw.app.state, "serving", None)
    token = raw.headers.get("authorization", "").partition(" ")[2].strip()
    if token and getattr(serving, "keyed", False):
        return "key:" + hashlib.sha256(token.encode("latin-1", "replace")).hexdigest()[:16]
    peer = raw.client
    return None if peer is None else f"{peer.host}:{peer.port}"


def constraints_of(
    req: SamplingRequest, extra: list[tuple[str, dict[str, Any]]] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Every output constraint an OpenAI-shaped request sets (field, StructuredOutputsParams kwargs)."""
    try:
        return req.structured_sources() + list(extra or [])
    except ValueError as exc:
        raise bad_request(str(exc), "response_format") from exc


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


@dataclass(slots=True)
class ServingConfig:
    """What the generation endpoints need to know about the served model and the server's limits."""

    model_name: str
    max_model_len: int
    vocab_size: int
    max_tokens_limit: int
    trust_request_chat_template: bool = False  # vLLM's --trust-request-chat-template
    tool_call_parser: str = "auto"  # how tool_choice auto reads calls (tool_parsers.PARSER_CHOICES)


@dataclass(slots=True)
class EngineRequest:
    """One API request in the engine's terms: what a route hands `OpenAIServing.generate`."""

    kind: str  # the response id's prefix ("cmpl", "chatcmpl", ...)
    model: str | None  # the model the client named (None: the API names none)
    prompts: list[str | list[int]]  # text (tokenized by the serving layer) or token ids
    sampling: dict[str, Any]  # SamplingParams' fields; a max_tokens of None takes `default_max_tokens`
    n: int = 1  # choices returned per prompt
    best_of: int | None = None  # candidates per prompt (the n of highest cumulative logprob are kept)
    default_max_tokens: int | None = None  # None: what the context leaves, at most the server's limit
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None  # keep the last k prompt tokens (-1: the context)
    constraints: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (field, constraint) found
    request_id: str | None = None  # the client's id for the response
    client: str | None = None  # who asks (API key, else the peer's address): the engine's fairness unit
    connection: Request | None = None  # the HTTP request: its client going away cancels the grammar's compile
    prompt_field: str = "prompt"  # the request field errors about the prompt name
    fields: dict[str, str] = field(default_factory=dict)  # engine field -> the request's name for it

    def param(self, name: str | None) -> str | None:
        return None if name is None else self.fields.get(name, name)


class OpenAIServing:
    """The serving layer every generation route shares (`generate`), with the pools it owns: chat template
    workers, the tokenizer threads and (through the engine) the grammar workers."""

    def __init__(
        self,
        engine: AsyncEngine,
        tokenizer: Any,
        config: ServingConfig,
        templates: TemplateRenderer | None = None,
        *,
        tokenizer_threads: int = 1,
    ) -> None:
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.templates = templates or TemplateRenderer(max_output_chars=max(1 << 20, 16 * config.max_model_len))
        self.tokens = TokenizerPool(tokenizer, config.max_model_len, threads=tokenizer_threads)
        self.grammar_limits = GrammarLimits()
        self.stats = ServerStats()  # what the HTTP layer counts (event-loop side only)
        self.draining = False  # set on SIGTERM / SIGINT: new requests get 503
        self.keyed = False  # the server checks an API key (build_app sets it)

    def close(self) -> None:
        """Stop the worker pools this layer owns, and the engine's grammar workers it started."""
        self.templates.close()
        self.tokens.close()
        grammars = getattr(self.engine.engine, "_grammars", None)
        if grammars is not None:
            grammars.close()

    # ---- what routes call before they have an EngineRequest -------------------------------------

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

    async def encode(self, text: str, *, add_special_tokens: bool, field: str = "prompt") -> list[int]:
        """Token ids of `text`, off the event loop; a 400 naming `field` when it cannot fit the context."""
        return await self.tokens.encode(text, add_special_tokens=add_special_tokens, field=field)

    # ---- the one path --------------------------------------------------------------------------

    async def generate(self, req: EngineRequest) -> Generation:
        """Check, tokenize, compile and admit `req`; a client mistake is a 4xx naming its field."""
        if self.draining:
            raise APIError(503, "the server is shutting down; retry on another replica", code="shutting_down")
        self.check_model(req.model)
        base = self._base_params(req)
        fan = req.best_of or req.n
        if fan > req.n and base.logprobs is None:
            base = dataclasses.replace(base, logprobs=0)  # ranking candidates needs their tokens' logprobs
        constraint = self._constraint(req)
        if req.truncate_prompt_tokens is None:  # every prompt's length before any is tokenized
            for prompt in req.prompts:
                if isinstance(prompt, str):
                    self.tokens.check_length(prompt, req.prompt_field)
        if base.bad_words:
            base = dataclasses.replace(base, bad_words_token_ids=await self.tokens.bad_words(base.bad_words))
        self._check_samplable(req, base, constraint is not None)
        prompts = [await self._prompt_ids(req, i, p) for i, p in enumerate(req.prompts)]
        max_tokens = [self._max_tokens(req, len(ids)) for ids in prompts]
        self._check_fan(req, len(prompts) * fan, fan)
        spec = None if constraint is None else constraint[1]
        params = [
            self._choice_params(req, base, max_tokens[p], j, spec) for p in range(len(prompts)) for j in range(fan)
        ]
        compiled = None if constraint is None else await self._compile(constraint[1], constraint[0], req.connection)
        try:
            gen = await self._admit(req, prompts, params, fan)
        finally:
            if compiled is not None:
                compiled.compiler.release(compiled.key)  # the engine copied the template (or refused the request)
        gen.fields = {**req.fields, **({"structured_outputs": constraint[0]} if constraint else {})}
        return gen

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.config.model_name:
            raise APIError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.config.model_name}`",
                param="model",
                code="model_not_found",
            )

    def _base_params(self, req: EngineRequest) -> SamplingParams:
        """The request's SamplingParams before its prompts are known (max_tokens checked against the server's
        limit; each choice's own max_tokens and seed come later): the engine's range checks, and the token
        lists against the vocabulary, before anything costly runs."""
        kw = dict(req.sampling)
        requested = kw.get("max_tokens")
        cap = self.config.max_tokens_limit
        if requested is not None and requested > cap:
            raise bad_request(f"max_tokens is {requested}; this server allows at most {cap}", req.param("max_tokens"))
        kw["max_tokens"] = cap if requested is None else requested
        vocab = self.config.vocab_size
        for name in ("stop_token_ids", "allowed_token_ids", "logit_bias"):
            ids = [int(t) for t in kw.get(name) or ()]
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise bad_request(
                    f"{req.param(name)} has token ids outside [0, {vocab}) (the vocabulary): {bad[:8]}", req.param(name)
                )
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), req.param(param_of(exc))) from exc

    def _constraint(self, req: EngineRequest) -> tuple[str, StructuredOutputsParams] | None:
        """The request's one output constraint (the field that sets it, its spec), past the static grammar
        limits; None without one."""
        if not req.constraints:
            return None
        if len(req.constraints) > 1:
            names = ", ".join(name for name, _ in req.constraints)
            raise bad_request(f"one output constraint per request; this one sets {names}", req.constraints[1][0])
        name, kwargs = req.constraints[0]
        try:
            spec = StructuredOutputsParams(**kwargs)
            check_spec(spec.kind, getattr(spec, spec.kind), self.grammar_limits)
        except (ValueError, TypeError) as exc:
            field_name = (param_of(exc) or name) if name == "structured_outputs" else name
            raise bad_request(f"{name}: {exc}" if field_name == name else str(exc), field_name) from exc
        return name, spec

    def _check_samplable(self, req: EngineRequest, p: SamplingParams, constrained: bool) -> None:
        """A 400 naming the fields when they leave no token to sample at the first step."""
        if p.allowed_token_ids is None:
            return
        always = {seq[0] for seq in p.bad_words_token_ids or () if len(seq) == 1}
        left = set(p.allowed_token_ids) - always
        if not left:
            raise bad_request(
                f"{req.param('allowed_token_ids')} and {req.param('bad_words')} leave no token to sample: every "
                f"allowed token is a bad word",
                req.param("allowed_token_ids"),
            )
        ends = set(getattr(self.engine.engine, "eos_token_ids", ())) | set(p.stop_token_ids or ())
        if p.min_tokens and not constrained and not left - ends:
            raise bad_request(
                f"{req.param('min_tokens')} ({p.min_tokens}) and {req.param('allowed_token_ids')} leave no token "
                f"to sample: before min_tokens the end-of-sequence and stop tokens are masked, and they are the only "
                f"allowed tokens",
                req.param("min_tokens"),
            )

    async def _prompt_ids(self, req: EngineRequest, index: int, prompt: str | list[int]) -> list[int]:
        where = f"{req.prompt_field} {index}" if len(req.prompts) > 1 else req.prompt_field
        if isinstance(prompt, str):
            # with truncation the text may be longer than the context: only the tokenizer knows where to cut
            bounded = req.truncate_prompt_tokens is None
            ids = await self.tokens.encode(
                prompt, add_special_tokens=req.add_special_tokens, field=req.prompt_field, bounded=bounded
            )
            if not ids:
                raise bad_request(f"{where} tokenizes to no tokens", req.prompt_field)
        else:
            ids = list(prompt)
            vocab = self.config.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise bad_request(f"{where} has token ids outside [0, {vocab}) (the vocabulary)", req.prompt_field)
        k = req.truncate_prompt_tokens
        if k is None:
            return ids
        k = self.config.max_model_len if k == -1 else k
        if k < 1:
            raise bad_request("truncate_prompt_tokens must be -1 or >= 1", req.param("truncate_prompt_tokens"))
        return ids[-k:]

    def _max_tokens(self, req: EngineRequest, prompt_len: int) -> int:
        """The prompt against the context, and max_tokens (asked, else the default) against what is left."""
        ctx, cap = self.config.max_model_len, self.config.max_tokens_limit
        requested = req.sampling.get("max_tokens")
        if prompt_len >= ctx:
            raise bad_request(
                f"This model's maximum context length is {ctx} tokens, but the prompt has "
                f"{prompt_len} tokens (at most {ctx - 1} fit, with room for one new token)",
                req.prompt_field,
            )
        if requested is not None and prompt_len + requested > ctx:
            raise bad_request(
                f"This model's maximum context length is {ctx} tokens; you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for "
                f"the completion). Lower max_tokens or the prompt.",
                req.param("max_tokens"),
            )
        if requested is not None:
            return int(requested)
        room = ctx - prompt_len
        return min(cap, room) if req.default_max_tokens is None else min(req.default_max_tokens, cap, room)

    def _check_fan(self, req: EngineRequest, total: int, fan: int) -> None:
        bound = self.engine.max_admitted
        if total > bound:  # 503 would say "retry later" to a request no retry can ever get admitted
            what = f"n={req.n}" if fan == req.n else f"best_of={fan}"
            raise bad_request(
                f"this request asks for {total} sequences ({len(req.prompts)} prompt(s) x {what}); this "
                f"server admits at most {bound} at once (--max-num-seqs + --max-waiting): lower n or send "
                f"fewer prompts per request",
                req.param("n") if fan == req.n else req.param("best_of"),
            )

    def _choice_params(
        self, req: EngineRequest, base: SamplingParams, max_tokens: int, choice: int, spec: Any
    ) -> SamplingParams:
        seed = base.seed
        if seed is not None and choice:
            seed = (seed + choice) % _SEED_SPAN  # distinct, reproducible seeds per choice
        try:
            return dataclasses.replace(base, max_tokens=max_tokens, seed=seed, structured_outputs=spec)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), req.param(param_of(exc))) from exc

    async def _compile(
        self, spec: StructuredOutputsParams, field_name: str, connection: Request | None = None
    ) -> Compile | None:
        """Compile the request's grammar in a sandbox worker and pin its template until the engine has added
        the request: the request waits for its grammar (at most the compile timeout; its compile is killed
        then, or when the client goes away), the running batch does not."""
        grammars = getattr(self.engine.engine, "grammars", None)
        if grammars is None:  # an engine without structured outputs (a test double)
            return None
        compiler = await asyncio.to_thread(grammars)  # built on first use (the llguidance tokenizer, ~1 s)
        if compiler.limits != self.grammar_limits:
            compiler.configure(self.grammar_limits)
        timeout = self.grammar_limits.compile_timeout_s
        try:
            handle = compiler.prepare(spec.kind, getattr(spec, spec.kind), time.monotonic() + timeout)
        except GrammarBusy as exc:
            raise APIError(503, str(exc), code="server_overloaded") from exc
        except ValueError as exc:
            raise bad_request(str(exc), param_of(exc) if field_name == "structured_outputs" else field_name) from exc
        done = asyncio.ensure_future(asyncio.wait_for(asyncio.shield(asyncio.wrap_future(handle.future)), timeout + 1))
        gone = asyncio.ensure_future(disconnected(connection)) if connection is not None else None
        try:
            await asyncio.wait({done} | ({gone} if gone else set()), return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                raise APIError(499, "the client closed the request while its grammar compiled", code="client_closed")
            done.result()  # the worker is killed at the deadline; what compiled is built here too, as long again
            return handle
        except asyncio.TimeoutError as exc:
            raise bad_request(
                f"{field_name}: the grammar did not compile within this server's limit of {timeout:g} s", field_name
            ) from exc
        except GrammarBusy as exc:
            raise APIError(503, str(exc), code="server_overloaded") from exc
        except ValueError as exc:
            raise bad_request(str(exc), param_of(exc) if field_name == "structured_outputs" else field_name) from exc
        finally:
            for task in (done, gone):
                if task is not None and not task.done():
                    task.cancel()
            if not handle.future.done() or handle.future.cancelled() or handle.future.exception() is not None:
                handle.cancel()

    async def _admit(
        self, req: EngineRequest, prompts: list[list[int]], params: list[SamplingParams], fan: int
    ) -> Generation:
        arrival = time.perf_counter()
        rid = f"{req.kind}-{uuid.uuid4().hex}"
        ids, prompt_ids, choices = [], [], {}
        for p, ptoks in enumerate(prompts):
            for j in range(fan):
                sub = f"{rid}-{p * fan + j}"
                ids.append(sub)
                prompt_ids.append(ptoks)
                choices[sub] = Choice(
                    index=p * fan + j, prompt_index=p, prompt_tokens=len(ptoks), prompt_token_ids=ptoks
                )
        try:
            stream = await self.engine.open(ids, prompt_ids, params, client=req.client)
        except Overloaded as exc:
            raise APIError(503, str(exc), code="server_overloaded") from exc
        except EngineDead as exc:
            raise APIError(503, str(exc), code="engine_dead") from exc
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), req.param(param_of(exc))) from exc
        gen = Generation(self, f"{req.kind}-{req.request_id}" if req.request_id else rid, stream, choices, arrival)
        gen.keep = req.n if fan > req.n else None
        return gen

    # ---- answering -----------------------------------------------------------------------------

    async def respond(
        self,
        raw: Request,
        stream: bool,
        gen: Generation,
        events: Callable[[], AsyncIterator[str]],
        body: Callable[[], Any],
    ) -> Response:
        """The answer: SSE from `events()` when streaming, else `body()` once the generation is complete."""
        if stream:
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
        gone = asyncio.ensure_future(disconnected(raw))
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
