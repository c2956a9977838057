"""`/v1/messages` and `/v1/messages/count_tokens`: the conversation rendered as a chat, run on the one engine path,
answered as Anthropic's message object or its event stream (`message_start`, `content_block_start` / `_delta` /
`_stop` per text or tool_use block, `message_delta` with the stop reason, `message_stop`, and a `ping`).

Errors use Anthropic's body (`errors.install_handlers` picks it for these paths). A stop sequence is reported by
name: the engine keeps it in the text (`include_stop_str_in_output`) and it is cut here, so the answer says which
one ended the message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from keel.engine.async_engine import Drained, EngineDead
from keel.entrypoints.anthropic.protocol import CountTokensRequest, MessageObject, MessagesRequest, TokenCount, Usage
from keel.entrypoints.openai.conversation import Conversation, Prepared, prepare
from keel.entrypoints.openai.errors import APIError, anthropic_body, log
from keel.entrypoints.openai.generation import Choice, Generation, SSEResponse
from keel.entrypoints.openai.responses.items import new_id
from keel.entrypoints.openai.serving_engine import EngineRequest, OpenAIServing, client_of
from keel.entrypoints.openai.tool_parsers import ArgsDelta, CallEnd, CallStart, Text, TextGate, ToolCall


def event(kind: str, payload: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


class AnthropicServingMessages:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    def _conversation(self, req: CountTokensRequest | MessagesRequest) -> Conversation:
        """The request as a chat; a final assistant message is a prefill the answer continues (Anthropic's rule)."""
        choice, name = req.choice
        messages = req.conversation()
        prefill = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
        return Conversation(
            messages=messages,
            tools=req.tool_specs(),
            tool_choice=choice,
            function=name,
            parallel_tool_calls=req.parallel,
            add_generation_prompt=not prefill,
            continue_final_message=prefill,
        )

    async def count_tokens(self, req: CountTokensRequest) -> JSONResponse:
        """The prompt's tokens as /v1/messages would render it (its tools included)."""
        s = self.serving
        s.check_model(req.model)
        conv = self._conversation(req)
        conv.tool_choice = "none"  # what the output would be parsed as does not change the prompt
        prepared = await prepare(s, conv)
        ids = await s.encode(prepared.prompt, add_special_tokens=False, field="messages")
        return JSONResponse(TokenCount(input_tokens=len(ids)).model_dump())

    async def create(self, req: MessagesRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req.model)
        prepared = await prepare(s, self._conversation(req))
        stops = list(req.stop_sequences or [])
        sampling = {
            "max_tokens": req.max_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "top_k": req.top_k or 0,
            "stop": stops,
            "include_stop_str_in_output": bool(stops),  # to tell which one matched
        }
        gen = await s.generate(
            EngineRequest(
                kind="msg",
                model=req.model,
                prompts=[prepared.prompt],
                sampling=prepared.sampling(sampling),
                add_special_tokens=False,  # the chat template wrote the special tokens
                constraints=prepared.constraints or req.constraints(),  # a forced call is not text to format
                client=client_of(raw),
                prompt_field="messages",
                fields={"stop": "stop_sequences"},
            )
        )
        message = _Message(self, req, prepared, gen)
        if req.stream:
            return SSEResponse(message.events(), gen.close)
        return await s.respond(raw, False, gen, message.events, message.body)


class _Message:
    """One message being made: the engine's text cut at its stop sequence, read for tool calls, as blocks."""

    def __init__(
        self, owner: AnthropicServingMessages, req: MessagesRequest, prepared: Prepared, gen: Generation
    ) -> None:
        self.owner, self.req, self.plan, self.gen = owner, req, prepared.plan, gen
        self.id = new_id("msg")
        self.stop_sequence: str | None = None
        eos = getattr(owner.serving.engine.engine, "eos_token_ids", ())
        tok = owner.serving.tokenizer
        # the end-of-sequence token's own text, which include_stop_str_in_output adds where special tokens are kept
        self.eos_texts = (
            [t for i in eos if (t := tok.decode([i], skip_special_tokens=False))] if req.stop_sequences else []
        )

    def _cut(self, text: str, finished: bool) -> str:
        """The final text without the stop sequence that ended it (remembered) or the end-of-sequence text."""
        if not finished or not self.req.stop_sequences:
            return text
        for s in self.req.stop_sequences:
            if text.endswith(s):
                self.stop_sequence = s
                return text[: -len(s)]
        for t in self.eos_texts if self.plan.keeps_special_tokens else ():
            if text.endswith(t):
                return text[: -len(t)]
        return text

    def stop_reason(self, choice: Choice, calls: int) -> str:
        if choice.finish_reason == "length":
            return "max_tokens"
        if calls:
            return "tool_use"
        return "stop_sequence" if self.stop_sequence is not None else "end_turn"

    def _usage(self) -> Usage:
        u = self.gen.usage()
        cached = (u.prompt_tokens_details or {}).get("cached_tokens", 0)
        return Usage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens, cache_read_input_tokens=cached)

    def body(self) -> MessageObject:
        choice = self.gen.ordered()[0]
        content, calls = self.plan.parser(stream=False).parse(self._cut(choice.text, True))
        if not self.req.parallel:
            calls = calls[:1]
        blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
        blocks += [_tool_use(c) for c in calls]
        return MessageObject(
            id=self.id,
            model=self.req.model,
            content=blocks,
            stop_reason=self.stop_reason(choice, len(calls)),  # type: ignore[arg-type]
            stop_sequence=self.stop_sequence,
            usage=self._usage(),
        )

    async def events(self) -> AsyncIterator[str]:
        """Anthropic's event stream; an error after the headers went out is an `error` event."""
        start = {"id": self.id, "type": "message", "role": "assistant", "model": self.req.model, "content": []}
        usage = {"input_tokens": self._usage().input_tokens, "output_tokens": 0}
        yield event("message_start", {"message": {**start, "stop_reason": None, "stop_sequence": None, "usage": usage}})
        yield event("ping", {})
        blocks = _Blocks(self)
        try:
            async for c, out in self.gen.outputs():
                delta = self._cut(out.delta_text, out.finished)
                events = blocks.parser.feed(delta) if delta else []
                if out.finished:
                    events += blocks.parser.finish()
                for e in events:
                    for chunk in blocks.render(e):
                        yield chunk
                if out.finished:
                    for chunk in blocks.finish():
                        yield chunk
                    reason = self.stop_reason(c, blocks.gate.calls)
                    stop = {"stop_reason": reason, "stop_sequence": self.stop_sequence}
                    yield event("message_delta", {"delta": stop, "usage": {"output_tokens": c.completion_tokens}})
            yield event("message_stop", {})
        except Exception as exc:  # every failure becomes the stream's error event
            yield _error_event(exc)


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input()}


def _error_event(exc: Exception) -> str:
    if isinstance(exc, APIError):
        err = exc
    elif isinstance(exc, EngineDead):
        err = APIError(503, str(exc), code="shutting_down" if isinstance(exc, Drained) else "engine_dead")
    else:
        log.exception("keel serve: engine error while streaming a message")
        err = APIError(500, f"internal server error: {type(exc).__name__}: {exc}")
    body = anthropic_body(err)
    return event("error", {"error": body["error"]})


class _Blocks:
    """Parser events as content blocks and their stream events, in order."""

    def __init__(self, message: _Message) -> None:
        self.message, self.gate = message, TextGate()
        self.parser = message.plan.parser(stream=True)
        self.index = -1  # the open block's index
        self.open: str | None = None  # "text" | "tool_use"
        self.single = not message.req.parallel

    def _start(self, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        return [*out, event("content_block_start", {"index": self.index, "content_block": block})]

    def finish(self) -> list[str]:
        """The output ended: its last text, and the open block stopped."""
        rest = self.gate.end()
        return [*(self._text(rest) if rest else []), *self.close()]

    def _text(self, text: str) -> list[str]:
        out = self._start({"type": "text", "text": ""}) if self.open != "text" else []
        delta = {"type": "text_delta", "text": text}
        return [*out, event("content_block_delta", {"index": self.index, "delta": delta})]

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def render(self, e: Any) -> list[str]:
        if isinstance(e, Text):
            text = self.gate.text(e.text) if self.message.plan.mode != "none" else e.text
            return self._text(text) if text else []
        if self.single and e.index > 0:
            return []
        if isinstance(e, CallStart):
            self.gate.call()
            return self._start({"type": "tool_use", "id": e.id, "name": e.name, "input": {}})
        if isinstance(e, ArgsDelta) and e.text:
            delta = {"type": "input_json_delta", "partial_json": e.text}
            return [event("content_block_delta", {"index": self.index, "delta": delta})]
        if isinstance(e, CallEnd):
            return self.close()
        return []
