"""`/v1/chat/completions`: render the conversation with the chat template, run it, answer whole or as SSE.

Tools are planned as for every API (`conversation.prepare`): "required" and a named function constrain the output
with a JSON schema of the call (the grammar engine, so any model returns a valid call); "auto" reads the model
family's format (`--tool-call-parser`); "none" reads nothing. The parser's events come back as OpenAI's
`message.tool_calls`, or streamed as `delta.tool_calls` whose arguments arrive as the model writes them.
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
from keel.entrypoints.openai.conversation import Conversation, Prepared, prepare
from keel.entrypoints.openai.generation import SSE_DONE, Choice, Generation, sse
from keel.entrypoints.openai.logprobs import chat_content, vllm_prompt_logprobs
from keel.entrypoints.openai.serving_engine import EngineRequest, OpenAIServing, client_of, constraints_of
from keel.entrypoints.openai.tool_parsers import ArgsDelta, CallStart, Event, Text, TextGate, ToolParser, ToolPlan


class OpenAIServingChat:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def prepare(self, req: ChatCompletionRequest) -> Prepared:
        """The request's prompt (the conversation and tools through the chat template) and its tool plan."""
        named = req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None
        choice = "named" if named else (req.tool_choice if isinstance(req.tool_choice, str) else None)
        conv = Conversation(
            messages=req.conversation(),
            tools=req.tool_specs(),
            tool_choice=choice,
            function=named,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            documents=req.documents,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
        )
        return await prepare(self.serving, conv)

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req.model)
        prepared = await self.prepare(req)
        max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        gen = await s.generate(
            EngineRequest(
                kind="chatcmpl",
                model=req.model,
                prompts=[prepared.prompt],
                sampling=prepared.sampling(
                    req.sampling_fields(
                        max_tokens=req.max_new_tokens,
                        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                        prompt_logprobs=req.prompt_logprobs,
                    )
                ),
                n=req.n,
                best_of=req.best_of,
                add_special_tokens=req.add_special_tokens,
                truncate_prompt_tokens=req.truncate_prompt_tokens,
                constraints=self._constraints(req, prepared),
                request_id=req.request_id,
                client=client_of(raw),
                connection=raw,
                prompt_field="messages",
                fields={"max_tokens": max_field, "logprobs": "top_logprobs"},
            )
        )
        plan = prepared.plan
        return await s.respond(
            raw, req.stream, gen, lambda: self._events(req, gen, plan), lambda: self._body(req, gen, plan)
        )

    @staticmethod
    def _constraints(req: ChatCompletionRequest, prepared: Prepared) -> list[tuple[str, dict[str, Any]]]:
        """The request's output constraints and its tools'; a forced call writes no text for response_format to
        format, so the call's schema replaces it (any other two constraints are a 400)."""
        found = constraints_of(req, prepared.constraints)
        if prepared.constraints:
            found = [c for c in found if c[0] != "response_format"]
        return found

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

    def _message(self, req: ChatCompletionRequest, c: Choice, plan: ToolPlan) -> tuple[ChatCompletionMessage, Any]:
        """The choice's message (content and/or tool calls) and its finish reason."""
        content, calls = plan.parser(stream=False).parse(c.text)
        if req.parallel_tool_calls is False:
            calls = calls[:1]
        text = None if content is None else self._echo(req) + content
        message = ChatCompletionMessage(content=text, tool_calls=[t.body() for t in calls])
        return message, plan.finish_reason(c.finish_reason, len(calls))

    def _body(self, req: ChatCompletionRequest, gen: Generation, plan: ToolPlan) -> ChatCompletionResponse:
        choices, first = [], None
        for c in gen.ordered():
            first = first or c
            message, finish = self._message(req, c, plan)
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

    async def _events(self, req: ChatCompletionRequest, gen: Generation, plan: ToolPlan) -> AsyncIterator[str]:
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

        tools = _ToolStream(req, plan, [c.index for c in gen.ordered()])
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
    """A streamed chat's deltas per engine output: each choice's text through the plan's parser, its events as
    `delta.content` and `delta.tool_calls` (a call's id and name, then its arguments as they are written)."""

    def __init__(self, req: ChatCompletionRequest, plan: ToolPlan, indices: list[int]) -> None:
        self.plan, self.single = plan, req.parallel_tool_calls is False
        self.parsers: dict[int, ToolParser] = {i: plan.parser(stream=True) for i in indices}
        self.gates = {i: TextGate() for i in indices}

    def deltas(self, c: Choice, out: Any) -> list[DeltaMessage]:
        parser, gate = self.parsers[c.index], self.gates[c.index]
        events: list[Event] = parser.feed(out.delta_text) if out.delta_text else []
        if out.finished:
            events += parser.finish()
        deltas: list[DeltaMessage] = []
        for e in events:
            if isinstance(e, Text):
                text = gate.text(e.text) if self.plan.mode != "none" else e.text
                if text:
                    deltas.append(DeltaMessage(content=text))
            elif self.single and e.index > 0:
                continue  # parallel_tool_calls false: the first call only
            elif isinstance(e, CallStart):
                gate.call()
                call = {"id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}}
                deltas.append(DeltaMessage(tool_calls=[{"index": e.index, **call}]))
            elif isinstance(e, ArgsDelta) and e.text:
                deltas.append(DeltaMessage(tool_calls=[{"index": e.index, "function": {"arguments": e.text}}]))
        if out.finished and (rest := gate.end()):
            deltas.append(DeltaMessage(content=rest))
        return deltas

    def finish_reason(self, c: Choice) -> Any:
        return self.plan.finish_reason(c.finish_reason, self.gates[c.index].calls)
