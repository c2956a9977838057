"""`/v1/chat/completions`: render the conversation with the chat template, run it, answer whole or as SSE.

Tools: `tool_choice` "required" and a named function constrain the output with a JSON schema of the
call (the grammar engine, so any model returns a valid call); "auto" parses the Hermes-style
`<tool_call>` blocks of models whose template renders tools (Qwen2.5/Qwen3); "none" parses nothing.
Calls come back as OpenAI's `message.tool_calls` / streamed `delta.tool_calls`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from keel.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
    NamedToolChoice,
)
from keel.entrypoints.openai.chat_utils import chat_job, renders_tools
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.logprobs import chat_content, vllm_prompt_logprobs
from keel.entrypoints.openai.serving_engine import SSE_DONE, Choice, Generation, OpenAIServing, sse
from keel.entrypoints.openai.tool_parsers import (
    HermesStreamParser,
    ToolCall,
    calls_from_required,
    parse_hermes,
    required_schema,
)


class OpenAIServingChat:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        """The request's prompt: the conversation (and tools) through the chat template, tokenized."""
        s = self.serving
        s.check_chat_template(req.chat_template)
        mode = req.tool_mode
        if mode == "auto" and not renders_tools(req.chat_template or s.tokenizer.chat_template):
            raise bad_request(
                "tool_choice auto (the default with tools) needs a chat template that renders tools, and this "
                "model's does not; send tool_choice required or a named function (enforced by the grammar "
                "engine), or a chat_template that renders tools",
                "tool_choice",
            )
        try:
            job = chat_job(
                s.tokenizer,
                req.conversation(),
                tools=req.tool_specs() or None,
                documents=req.documents,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template=req.chat_template,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        except ValueError as exc:  # no chat template, or the request's template fields disagree
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from exc
        text = await s.render_template(job)
        ids = await s.encode(text, add_special_tokens=req.add_special_tokens)
        if not ids:
            raise bad_request("the rendered conversation has no tokens", "messages")
        return s.truncate(req, ids)

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req)
        ids = await self.prompt_ids(req)
        for name in ("stop_token_ids", "allowed_token_ids"):
            s.check_token_list(getattr(req, name), name)
        s.check_token_list([int(k) for k in req.logit_bias or {}], "logit_bias")
        max_tokens = s.max_tokens_for(req, req.max_new_tokens, len(ids), default=None)
        extra: list[tuple[str, dict[str, Any]]] = []
        specs = [t.function for t in req.tools or []]
        if req.tool_mode == "required":
            tools = [{"name": f.name, "parameters": f.parameters} for f in specs]
            extra.append(("tool_choice", {"json": required_schema(tools, req.parallel_tool_calls is not False)}))
        elif req.tool_mode == "named":
            assert isinstance(req.tool_choice, NamedToolChoice)
            fn = next(f for f in specs if f.name == req.tool_choice.function.name)  # checked by the request
            extra.append(("tool_choice", {"json": fn.parameters or {"type": "object", "properties": {}}}))
        constraint, structured = s.structured(req, extra)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        if req.best_of is not None and req.best_of > req.n and logprobs is None:
            logprobs = 0  # ranking candidates needs their tokens' logprobs
        gen = await s.start(
            "chatcmpl",
            req,
            [ids],
            lambda p, j: s.sampling_params(
                req, max_tokens, j, logprobs=logprobs, prompt_logprobs=req.prompt_logprobs, structured=structured
            ),
            constraint,
        )
        return await s.respond(raw, req, gen, lambda: self._events(req, gen), lambda: self._body(req, gen))

    def _echo(self, req: ChatCompletionRequest) -> str:
        last = req.messages[-1]
        return last.text() if req.echo and last.role == "assistant" else ""

    def _logprobs(self, req: ChatCompletionRequest, token_ids: list[int], steps: list[dict[int, Any]]) -> Any:
        if not req.logprobs:
            return None
        content = chat_content(
            token_ids, steps, req.top_logprobs or 0, self.serving.tokenizer, bool(req.return_tokens_as_token_ids)
        )
        return {"content": content, "refusal": None}

    def _message(self, req: ChatCompletionRequest, c: Choice) -> tuple[ChatCompletionMessage, Any]:
        """The choice's message (content and/or tool calls) and its finish reason."""
        mode, text, finish = req.tool_mode, c.text, c.finish_reason
        calls: list[ToolCall] = []
        content: str | None = self._echo(req) + text
        if mode == "auto":
            parsed, calls = parse_hermes(text)
            content = None if parsed is None else self._echo(req) + parsed
        elif mode == "required":
            calls = calls_from_required(text)
            if calls:
                content = None
        elif mode == "named":
            assert isinstance(req.tool_choice, NamedToolChoice)
            calls, content = [ToolCall(req.tool_choice.function.name, text)], None
        if req.parallel_tool_calls is False:
            calls = calls[:1]
        if calls and mode in ("auto", "required") and finish == "stop":
            finish = "tool_calls"
        return ChatCompletionMessage(content=content, tool_calls=[t.body() for t in calls]), finish

    def _body(self, req: ChatCompletionRequest, gen: Generation) -> ChatCompletionResponse:
        choices, first = [], None
        for c in gen.ordered():
            first = first or c
            message, finish = self._message(req, c)
            extras: dict[str, Any] = {"token_ids": c.token_ids} if req.return_token_ids else {}
            choices.append(
                ChatCompletionChoice(
                    index=c.index,
                    message=message,
                    logprobs=self._logprobs(req, c.token_ids, list(c.logprobs)),
                    finish_reason=finish,
                    **extras,
                )
            )
        top: dict[str, Any] = {}
        if req.prompt_logprobs is not None and first is not None:
            top["prompt_logprobs"] = vllm_prompt_logprobs(first.prompt_logprobs)
        if req.return_token_ids and first is not None:
            top["prompt_token_ids"] = first.prompt_token_ids
        return ChatCompletionResponse(
            id=gen.request_id, created=gen.created, model=req.model, choices=choices, usage=gen.usage(), **top
        )

    async def _events(self, req: ChatCompletionRequest, gen: Generation) -> AsyncIterator[str]:
        mode = req.tool_mode

        def chunk(index: int, delta: DeltaMessage, finish: Any = None, logprobs: Any = None, **extra: Any) -> str:
            choice = ChatCompletionStreamChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
            usage: dict[str, Any] = {}
            if req.include_usage:  # usage: null in each chunk, or (continuous_usage_stats) the counts so far
                usage["usage"] = gen.usage() if req.continuous_usage else None
            return sse(
                ChatCompletionStreamResponse(
                    id=gen.request_id, created=gen.created, model=req.model, choices=[choice], **usage, **extra
                )
            )

        parsers = {c.index: HermesStreamParser() for c in gen.ordered()} if mode == "auto" else {}
        ncalls: dict[int, int] = {}  # choice -> tool calls sent
        named_id: dict[int, ToolCall] = {}

        def call_delta(index: int, call: ToolCall) -> DeltaMessage:
            n = ncalls.get(index, 0)
            ncalls[index] = n + 1
            return DeltaMessage(tool_calls=[{"index": n, **call.body()}])

        for c in gen.ordered():  # OpenAI's first chunk per choice: the role, empty content (or vLLM's echo)
            extra: dict[str, Any] = {}
            if req.return_token_ids:
                extra["prompt_token_ids"] = c.prompt_token_ids
            yield chunk(c.index, DeltaMessage(role="assistant", content=self._echo(req)), **extra)
        sent_prompt_lp = False
        async for c, out in gen.outputs():
            extra = {}
            if req.prompt_logprobs is not None and not sent_prompt_lp and c.prompt_logprobs is not None:
                extra["prompt_logprobs"], sent_prompt_lp = vllm_prompt_logprobs(c.prompt_logprobs), True
            new_lp = list(out.new_logprobs or [])
            logprobs = self._logprobs(req, out.new_token_ids, new_lp) if out.new_token_ids else None
            deltas: list[DeltaMessage] = []
            if mode == "auto":
                events = parsers[c.index].feed(out.delta_text) if out.delta_text else []
                if out.finished:
                    events += parsers[c.index].finish()
                for kind, value in events:
                    if kind == "content":
                        deltas.append(DeltaMessage(content=value))
                    elif req.parallel_tool_calls is not False or not ncalls.get(c.index):
                        deltas.append(call_delta(c.index, value))
            elif mode == "named":
                assert isinstance(req.tool_choice, NamedToolChoice)
                if c.index not in named_id:
                    named_id[c.index] = call = ToolCall(req.tool_choice.function.name, "")
                    deltas.append(call_delta(c.index, call))
                if out.delta_text:
                    deltas.append(DeltaMessage(tool_calls=[{"index": 0, "function": {"arguments": out.delta_text}}]))
            elif mode == "required":
                if out.finished:
                    calls = calls_from_required(c.text)
                    if req.parallel_tool_calls is False:
                        calls = calls[:1]
                    deltas += [call_delta(c.index, call) for call in calls]
                    if not calls and c.text:
                        deltas.append(DeltaMessage(content=c.text))
            elif out.delta_text:
                deltas.append(DeltaMessage(content=out.delta_text))
            if logprobs is not None and not deltas:
                deltas.append(DeltaMessage())  # tokens that released no text yet still carry their logprobs
            if req.return_token_ids and out.new_token_ids:
                extra["token_ids"] = out.new_token_ids
            for k, delta in enumerate(deltas):
                yield chunk(c.index, delta, logprobs=logprobs if k == 0 else None, **(extra if k == 0 else {}))
            if not deltas and extra:
                yield chunk(c.index, DeltaMessage(), **extra)
            if out.finished:
                finish = c.finish_reason
                if ncalls.get(c.index) and mode in ("auto", "required") and finish == "stop":
                    finish = "tool_calls"
                yield chunk(c.index, DeltaMessage(), finish)
        if req.include_usage:
            yield sse(
                ChatCompletionStreamResponse(
                    id=gen.request_id, created=gen.created, model=req.model, choices=[], usage=gen.usage()
                )
            )
        yield SSE_DONE
