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
from keel.entrypoints.openai.chat_utils import ChatInputError, chat_job, renders_tools
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.generation import SSE_DONE, Choice, Generation, sse
from keel.entrypoints.openai.logprobs import chat_content, vllm_prompt_logprobs
from keel.entrypoints.openai.serving_engine import EngineRequest, OpenAIServing, client_of, constraints_of
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

    async def prompt_text(self, req: ChatCompletionRequest) -> str:
        """The request's prompt: the conversation (and tools) through the chat template."""
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
        except ChatInputError as exc:
            raise bad_request(str(exc), exc.field) from exc
        except ValueError as exc:  # no chat template, or the request's template fields disagree
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from exc
        return await s.render_template(job)

    def _tool_constraints(self, req: ChatCompletionRequest) -> list[tuple[str, dict[str, Any]]]:
        """tool_choice required / named as an output constraint (a JSON schema of the call)."""
        specs = [t.function for t in req.tools or []]
        if req.tool_mode == "required":
            tools = [{"name": f.name, "parameters": f.parameters} for f in specs]
            return [("tool_choice", {"json": required_schema(tools, req.parallel_tool_calls is not False)})]
        if req.tool_mode == "named":
            assert isinstance(req.tool_choice, NamedToolChoice)
            fn = next(f for f in specs if f.name == req.tool_choice.function.name)  # checked by the request
            return [("tool_choice", {"json": fn.parameters or {"type": "object", "properties": {}}})]
        return []

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req.model)
        text = await self.prompt_text(req)
        max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        gen = await s.generate(
            EngineRequest(
                kind="chatcmpl",
                model=req.model,
                prompts=[text],
                sampling=req.sampling_fields(
                    max_tokens=req.max_new_tokens,
                    logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                    prompt_logprobs=req.prompt_logprobs,
                ),
                n=req.n,
                best_of=req.best_of,
                add_special_tokens=req.add_special_tokens,
                truncate_prompt_tokens=req.truncate_prompt_tokens,
                constraints=constraints_of(req, self._tool_constraints(req)),
                request_id=req.request_id,
                client=client_of(raw),
                prompt_field="messages",
                fields={"max_tokens": max_field, "logprobs": "top_logprobs"},
            )
        )
        return await s.respond(raw, req.stream, gen, lambda: self._events(req, gen), lambda: self._body(req, gen))

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

        tools = _ToolStream(req, [c.index for c in gen.ordered()])
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
            deltas = tools.deltas(c, out)
            if logprobs is not None and not deltas:
                deltas.append(DeltaMessage())  # tokens that released no text yet still carry their logprobs
            if req.return_token_ids and out.new_token_ids:
                extra["token_ids"] = out.new_token_ids
            for k, delta in enumerate(deltas):
                yield chunk(c.index, delta, logprobs=logprobs if k == 0 else None, **(extra if k == 0 else {}))
            if not deltas and extra:
                yield chunk(c.index, DeltaMessage(), **extra)
            if out.finished:
                yield chunk(c.index, DeltaMessage(), tools.finish_reason(c))
        if req.include_usage:
            yield sse(
                ChatCompletionStreamResponse(
                    id=gen.request_id, created=gen.created, model=req.model, choices=[], usage=gen.usage()
                )
            )
        yield SSE_DONE


class _ToolStream:
    """A streamed chat's deltas per engine output, by tool mode: Hermes blocks parsed as they come (auto),
    the named function's arguments as they come (named), the calls once complete (required), else text."""

    def __init__(self, req: ChatCompletionRequest, indices: list[int]) -> None:
        self.req, self.mode = req, req.tool_mode
        self.parsers = {i: HermesStreamParser() for i in indices} if self.mode == "auto" else {}
        self.ncalls: dict[int, int] = {}  # choice -> tool calls sent
        self.named: set[int] = set()  # choices whose named call was opened

    def _call(self, index: int, call: ToolCall) -> DeltaMessage:
        n = self.ncalls.get(index, 0)
        self.ncalls[index] = n + 1
        return DeltaMessage(tool_calls=[{"index": n, **call.body()}])

    def deltas(self, c: Choice, out: Any) -> list[DeltaMessage]:
        req, deltas = self.req, []
        if self.mode == "auto":
            events = self.parsers[c.index].feed(out.delta_text) if out.delta_text else []
            if out.finished:
                events += self.parsers[c.index].finish()
            for kind, value in events:
                if kind == "content":
                    deltas.append(DeltaMessage(content=value))
                elif req.parallel_tool_calls is not False or not self.ncalls.get(c.index):
                    deltas.append(self._call(c.index, value))
        elif self.mode == "named":
            assert isinstance(req.tool_choice, NamedToolChoice)
            if c.index not in self.named:
                self.named.add(c.index)
                deltas.append(self._call(c.index, ToolCall(req.tool_choice.function.name, "")))
            if out.delta_text:
                deltas.append(DeltaMessage(tool_calls=[{"index": 0, "function": {"arguments": out.delta_text}}]))
        elif self.mode == "required":
            if out.finished:
                calls = calls_from_required(c.text)
                if req.parallel_tool_calls is False:
                    calls = calls[:1]
                deltas += [self._call(c.index, call) for call in calls]
                if not calls and c.text:
                    deltas.append(DeltaMessage(content=c.text))
        elif out.delta_text:
            deltas.append(DeltaMessage(content=out.delta_text))
        return deltas

    def finish_reason(self, c: Choice) -> Any:
        if self.ncalls.get(c.index) and self.mode in ("auto", "required") and c.finish_reason == "stop":
            return "tool_calls"
        return c.finish_reason
