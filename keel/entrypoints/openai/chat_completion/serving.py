"""`/v1/chat/completions`: render the conversation with the chat template, run it, answer whole or as SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

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
)
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.serving_engine import SSE_DONE, Generation, OpenAIServing, sse


class OpenAIServingChat:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def create(self, req: ChatCompletionRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req)
        try:
            ids = s.tokenizer.encode_chat(req.conversation())
        except Exception as exc:  # no chat template, or the template refuses the conversation
            raise bad_request(f"cannot apply the model's chat template: {exc}", "messages") from exc
        max_tokens = s.max_tokens_for(req, req.max_new_tokens, len(ids), default=None)
        gen = await s.start("chatcmpl", req, [ids], [max_tokens])
        return await s.respond(
            raw,
            req,
            gen,
            lambda: self._events(req, gen),
            lambda: ChatCompletionResponse(
                id=gen.request_id,
                created=gen.created,
                model=req.model,
                choices=[
                    ChatCompletionChoice(
                        index=c.index, message=ChatCompletionMessage(content=c.text), finish_reason=c.finish_reason
                    )
                    for c in gen.ordered()
                ],
                usage=gen.usage(),
            ),
        )

    async def _events(self, req: ChatCompletionRequest, gen: Generation) -> AsyncIterator[str]:
        usage = {"usage": None} if req.include_usage else {}

        def chunk(index: int, delta: DeltaMessage, finish: Literal["stop", "length"] | None = None) -> str:
            choice = ChatCompletionStreamChoice(index=index, delta=delta, finish_reason=finish)
            return sse(
                ChatCompletionStreamResponse(
                    id=gen.request_id,
                    created=gen.created,
                    model=req.model,
                    choices=[choice],
                    **usage,  # type: ignore[arg-type]  # usage: null only when include_usage
                )
            )

        for c in gen.ordered():  # OpenAI's first chunk per choice: the role, empty content
            yield chunk(c.index, DeltaMessage(role="assistant", content=""))
        async for choice, out in gen.outputs():
            if out.delta_text:
                yield chunk(choice.index, DeltaMessage(content=out.delta_text))
            if out.finished:
                yield chunk(choice.index, DeltaMessage(), choice.finish_reason)
        if req.include_usage:
            yield sse(
                ChatCompletionStreamResponse(
                    id=gen.request_id, created=gen.created, model=req.model, choices=[], usage=gen.usage()
                )
            )
        yield SSE_DONE
