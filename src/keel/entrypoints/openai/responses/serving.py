"""`/v1/responses`: a request's items (and the stored conversation it chains on) rendered as a chat, run on the one
engine path, answered as a response object or as the Responses event stream; stored when asked (`store.py`).

Streamed, each parser event becomes the events OpenAI's SDK expects: a message item's `output_text.delta`s, a
function call item's `function_call_arguments.delta`s, each item added and done in order, between
`response.created` / `response.in_progress` and `response.completed` (or `response.incomplete` at the token limit).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from keel.engine.async_engine import Drained, EngineDead
from keel.entrypoints.openai.conversation import Conversation, prepare
from keel.entrypoints.openai.errors import APIError, bad_request, log
from keel.entrypoints.openai.generation import Generation, SSEResponse
from keel.entrypoints.openai.responses.items import as_input, call_item, message_item, new_id, to_messages
from keel.entrypoints.openai.responses.protocol import (
    DeletedResponse,
    FunctionChoice,
    ItemReference,
    OutputFunctionCall,
    OutputMessage,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from keel.entrypoints.openai.responses.store import ResponseStore, Stored
from keel.entrypoints.openai.serving_engine import ClientGone, EngineRequest, OpenAIServing, client_of
from keel.entrypoints.openai.tool_parsers import ArgsDelta, CallEnd, CallStart, Text, TextGate, ToolPlan


class Cancelled(Exception):
    """POST /v1/responses/{id}/cancel ended this response."""


def sse_event(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


class OpenAIServingResponses:
    def __init__(self, serving: OpenAIServing, store: ResponseStore) -> None:
        self.serving, self.store = serving, store

    async def create(self, req: ResponsesRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req.model)
        if req.store and not self.store.enabled:
            raise bad_request("store: this server keeps no responses (it runs with --response-store-mib 0)", "store")
        previous = self._previous(req.previous_response_id)
        items = [*(previous.items if previous is not None else []), *self._resolve(req.items(), previous)]
        choice, function = req.choice
        conv = Conversation(
            messages=to_messages(items, req.instructions),
            tools=req.tool_specs(),
            tool_choice=choice,
            function=function,
            parallel_tool_calls=req.parallel_tool_calls is not False,
        )
        prepared = await prepare(s, conv)
        gen = await s.generate(
            EngineRequest(
                kind="resp",
                model=req.model,
                prompts=[prepared.prompt],
                sampling=prepared.sampling(self._sampling(req)),
                add_special_tokens=False,  # the chat template wrote the special tokens
                # a forced call is not text: text.format constrains the messages of the turns that write some
                constraints=prepared.constraints or req.constraints(),
                client=client_of(raw),
                prompt_field="input",
                fields={"max_tokens": "max_output_tokens"},
            )
        )
        run = _Run(self, req, prepared.plan, gen, items)
        if req.stream:
            return SSEResponse(run.events(), run.close)
        return await run.whole(raw)

    @staticmethod
    def _sampling(req: ResponsesRequest) -> dict[str, Any]:
        top_k = req.top_k or 0
        return {
            "max_tokens": req.max_output_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "top_k": 0 if top_k < 0 else top_k,
            "min_p": req.min_p or 0.0,
            "repetition_penalty": req.repetition_penalty or 1.0,
            "seed": req.seed,
        }

    def _previous(self, response_id: str | None) -> Stored | None:
        if response_id is None:
            return None
        entry = self.store.get(response_id)
        if entry is None:
            raise bad_request(
                f"Previous response with id '{response_id}' not found (this server keeps responses sent with "
                f"store: true for at most {self.store.max_age_s:g} s, in this replica's memory)",
                "previous_response_id",
            )
        if entry.in_progress:
            raise bad_request(f"Previous response '{response_id}' is still in progress", "previous_response_id")
        return entry

    def _resolve(self, items: list[Any], previous: Stored | None) -> list[Any]:
        """Item references replaced by the stored items they name (the previous response's first)."""
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, ItemReference):
                out.append(item)
                continue
            found = self._stored_item(item.id, previous)
            if found is None:
                raise bad_request(f"input.{i}: no stored item with id '{item.id}'", f"input.{i}.id")
            out.append(found)
        return out

    def _stored_item(self, item_id: str, previous: Stored | None) -> Any:
        entries = [previous] if previous is not None else []
        entries += [e for e in self.store.entries() if e is not previous]
        for entry in entries:
            for candidate in entry.items:
                if getattr(candidate, "id", None) == item_id:
                    return candidate
        return None

    # ---- by id ---------------------------------------------------------------------------------------------------

    def _entry(self, response_id: str) -> Stored:
        entry = self.store.get(response_id)
        if entry is None:
            raise APIError(404, f"Response with id '{response_id}' not found", param="response_id", code="not_found")
        return entry

    def get(self, response_id: str) -> JSONResponse:
        return JSONResponse(self._entry(response_id).body)

    def delete(self, response_id: str) -> JSONResponse:
        entry = self._entry(response_id)
        if entry.cancel is not None:
            entry.cancel()
        self.store.delete(response_id)
        return JSONResponse(DeletedResponse(id=response_id).model_dump())

    def cancel(self, response_id: str) -> JSONResponse:
        entry = self._entry(response_id)
        if entry.cancel is None or not entry.in_progress:
            raise bad_request(
                f"Response '{response_id}' is {entry.body.get('status')}: only a response in progress can be cancelled",
                "response_id",
            )
        entry.cancel()
        return JSONResponse({**entry.body, "status": "cancelled"})


class _Run:
    """One response being made: its output items as the engine's text arrives, its body, its place in the store."""

    def __init__(
        self, owner: OpenAIServingResponses, req: ResponsesRequest, plan: ToolPlan, gen: Generation, items: list[Any]
    ) -> None:
        self.owner, self.req, self.plan, self.gen, self.items = owner, req, plan, gen, items
        self.id = new_id("resp")
        self.created = time.time()
        self.output: list[OutputMessage | OutputFunctionCall] = []
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self.seq = 0
        if req.store:
            owner.store.put(self.id, Stored(self.body(), [], len(json.dumps(self.body())), cancel=self.cancel))

    def cancel(self) -> None:
        """End the generation from another request: its reader sees `Cancelled`."""
        if not self.gen.stream.closed:
            self.gen.stream.outputs.put_nowait(Cancelled())
        self.gen.close()

    def close(self) -> None:
        """The stream ended however it ended: a response the client left mid-stream is stored as cancelled."""
        self.gen.close()
        if self.status == "in_progress":
            self._finish("cancelled")

    def body(self) -> dict[str, Any]:
        req, usage = self.req, None
        if self.status != "in_progress":
            u = self.gen.usage()
            usage = ResponseUsage(
                input_tokens=u.prompt_tokens,
                input_tokens_details=dict(u.prompt_tokens_details or {"cached_tokens": 0}),
                output_tokens=u.completion_tokens,
                output_tokens_details={"reasoning_tokens": 0},
                total_tokens=u.total_tokens,
            )
        fmt = req.text.format if req.text is not None else None
        tool_choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, FunctionChoice) else req.tool_choice
        return ResponseObject(
            id=self.id,
            created_at=self.created,
            completed_at=time.time() if self.status == "completed" else None,
            status=self.status,  # type: ignore[arg-type]
            error=self.error,
            incomplete_details={"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=self.owner.serving.config.model_name,
            output=list(self.output),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            store=bool(req.store),
            temperature=1.0 if req.temperature is None else req.temperature,
            text={"format": fmt.model_dump(by_alias=True) if fmt is not None else {"type": "text"}},
            tool_choice=tool_choice or ("auto" if req.tools else "none"),
            tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
            top_p=1.0 if req.top_p is None else req.top_p,
            usage=usage,
            user=req.user,
            metadata=dict(req.metadata or {}),
        ).model_dump()

    def _finish(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record how the response ended; update its stored copy (with the items a chained request continues)."""
        self.status, self.error = status, error
        body = self.body()
        store = self.owner.store
        if self.req.store and store.get(self.id) is not None:
            items = [*self.items, *(as_input(o) for o in self.output)]
            store.put(self.id, Stored(body, items, len(json.dumps(body)) + sum(len(repr(i)) for i in items)))
        return body

    def _ended(self) -> str:
        choice = self.gen.ordered()[0]
        return "incomplete" if choice.finish_reason == "length" else "completed"

    async def whole(self, raw: Request) -> Response:
        """Run to the end, then answer the response object."""
        try:
            await self.owner.serving.collect(raw, self.gen)
        except Cancelled:
            return JSONResponse(self._finish("cancelled"))
        except ClientGone:
            self.owner.store.delete(self.id)
            return Response(status_code=499)
        except EngineDead as exc:
            self._finish("failed", {"code": "engine_dead", "message": str(exc)})
            raise APIError(503, str(exc), code="shutting_down" if isinstance(exc, Drained) else "engine_dead") from exc
        except APIError as exc:
            self._finish("failed", {"code": exc.code or "server_error", "message": exc.message})
            raise
        choice = self.gen.ordered()[0]
        status = self._ended()
        content, calls = self.plan.parser(stream=False).parse(choice.text)
        if self.req.parallel_tool_calls is False:
            calls = calls[:1]
        if content is not None and (content or not calls):
            self.output.append(message_item(content, "incomplete" if status == "incomplete" else "completed"))
        self.output += [call_item(c) for c in calls]
        return JSONResponse(self._finish(status))

    # ---- streaming -----------------------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return sse_event({"type": kind, "sequence_number": self.seq - 1, **fields})

    async def events(self) -> AsyncIterator[str]:
        """The Responses event stream; an error after the headers went out is an `error` event and
        `response.failed`."""
        yield self._event("response.created", response=self.body())
        yield self._event("response.in_progress", response=self.body())
        writer = _ItemWriter(self)
        try:
            async for _, out in self.gen.outputs():
                events = writer.parser.feed(out.delta_text) if out.delta_text else []
                if out.finished:
                    events += writer.parser.finish()
                for e in events:
                    for chunk in writer.render(e):
                        yield chunk
            status = self._ended()
            for chunk in writer.close(status):
                yield chunk
            body = self._finish(status)
            yield self._event("response.completed" if status == "completed" else "response.incomplete", response=body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for chunk in self._failed(exc):
                yield chunk

    def _failed(self, exc: Exception) -> list[str]:
        if isinstance(exc, Cancelled):
            body = self._finish("cancelled")
            return [self._event("response.failed", response=body)]
        if isinstance(exc, APIError):
            code, message = exc.code or "server_error", exc.message
        elif isinstance(exc, EngineDead):
            code, message = ("shutting_down" if isinstance(exc, Drained) else "engine_dead"), str(exc)
        else:
            log.exception("keel serve: engine error while streaming a response")
            code, message = "server_error", f"internal server error: {type(exc).__name__}: {exc}"
        body = self._finish("failed", {"code": code, "message": message})
        return [
            self._event("error", code=code, message=message, param=None),
            self._event("response.failed", response=body),
        ]


class _ItemWriter:
    """Parser events as output items and their stream events, in order."""

    def __init__(self, run: _Run) -> None:
        self.run, self.gate = run, TextGate()
        self.parser = run.plan.parser(stream=True)
        self.single = run.req.parallel_tool_calls is False
        self.message: OutputMessage | None = None  # the message item being written
        self.text: list[str] = []
        self.calls: dict[int, tuple[OutputFunctionCall, int]] = {}  # call index -> (item, output index)

    def render(self, e: Any) -> list[str]:
        if isinstance(e, Text):
            text = self.gate.text(e.text) if self.run.plan.mode != "none" else e.text
            return self._text(text) if text else []
        if self.single and e.index > 0:
            return []
        if isinstance(e, CallStart):
            self.gate.call()
            out = self._close_message("completed")
            item = OutputFunctionCall(id=new_id("fc"), call_id=e.id, name=e.name, arguments="", status="in_progress")
            self.calls[e.index] = (item, len(self.run.output))
            self.run.output.append(item)
            return [
                *out,
                self.run._event(
                    "response.output_item.added", output_index=self.calls[e.index][1], item=item.model_dump()
                ),
            ]
        item, at = self.calls[e.index]
        if isinstance(e, ArgsDelta):
            item.arguments += e.text
            return (
                [
                    self.run._event(
                        "response.function_call_arguments.delta", item_id=item.id, output_index=at, delta=e.text
                    )
                ]
                if e.text
                else []
            )
        assert isinstance(e, CallEnd)
        item.status = "completed"
        return [
            self.run._event(
                "response.function_call_arguments.done",
                item_id=item.id,
                output_index=at,
                arguments=item.arguments,
                name=item.name,
            ),
            self.run._event("response.output_item.done", output_index=at, item=item.model_dump()),
        ]

    def _open_message(self) -> list[str]:
        run = self.run
        self.message = message = OutputMessage(id=new_id("msg"), status="in_progress", content=[])
        self.text = []
        run.output.append(message)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        at = len(run.output) - 1
        return [
            run._event("response.output_item.added", output_index=at, item=message.model_dump()),
            run._event("response.content_part.added", item_id=message.id, output_index=at, content_index=0, part=part),
        ]

    def _text(self, text: str) -> list[str]:
        out = self._open_message() if self.message is None else []
        assert self.message is not None
        self.text.append(text)
        at = self.run.output.index(self.message)
        delta = dict(item_id=self.message.id, output_index=at, content_index=0, delta=text, logprobs=[])
        return [*out, self.run._event("response.output_text.delta", **delta)]

    def _close_message(self, status: str) -> list[str]:
        run, message = self.run, self.message
        if message is None:
            return []
        self.message = None
        text = "".join(self.text)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        message.content, message.status = [part], status  # type: ignore[assignment]
        at = run.output.index(message)
        return [
            run._event(
                "response.output_text.done",
                item_id=message.id,
                output_index=at,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            run._event("response.content_part.done", item_id=message.id, output_index=at, content_index=0, part=part),
            run._event("response.output_item.done", output_index=at, item=message.model_dump()),
        ]

    def close(self, status: str) -> list[str]:
        """The output ended: the last text, and the open message item done."""
        rest = self.gate.end()
        out = self._text(rest) if rest else []
        if self.message is None and not self.run.output:  # an empty output is still one (empty) message
            out += self._open_message()
        return out + self._close_message("incomplete" if status == "incomplete" else "completed")
