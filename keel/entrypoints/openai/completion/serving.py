"""`/v1/completions`: tokenize the prompt(s), run them, answer whole or as SSE chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from keel.entrypoints.openai.completion.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from keel.entrypoints.openai.serving_engine import SSE_DONE, Generation, OpenAIServing, sse


class OpenAIServingCompletion:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        s = self.serving
        s.check_model(req)
        prompts: list[list[int]] = []
        for i, p in enumerate(req.prompts):
            if isinstance(p, str):
                ids = s.tokenizer.encode(p)
            else:
                ids = list(p)
                s.check_prompt_ids(ids, f"prompt {i}")
            prompts.append(ids)
        max_tokens = [s.max_tokens_for(req, req.max_tokens, len(ids), default=16) for ids in prompts]
        gen = await s.start("cmpl", req, prompts, max_tokens)
        return await s.respond(
            raw,
            req,
            gen,
            lambda: self._events(req, gen),
            lambda: CompletionResponse(
                id=gen.request_id,
                created=gen.created,
                model=req.model,
                choices=[
                    CompletionChoice(index=c.index, text=c.text, finish_reason=c.finish_reason) for c in gen.ordered()
                ],
                usage=gen.usage(),
            ),
        )

    async def _events(self, req: CompletionRequest, gen: Generation) -> AsyncIterator[str]:
        rid = gen.request_id
        usage = {"usage": None} if req.include_usage else {}
        async for choice, out in gen.outputs():
            if not out.delta_text and not out.finished:
                continue  # a token that completes no character yet (or held back for a stop string)
            chunk = CompletionStreamResponse(
                id=rid,
                created=gen.created,
                model=req.model,
                choices=[CompletionChoice(index=choice.index, text=out.delta_text, finish_reason=choice.finish_reason)],
                **usage,  # type: ignore[arg-type]  # usage: null only when include_usage (the field set)
            )
            yield sse(chunk)
        if req.include_usage:
            yield sse(
                CompletionStreamResponse(id=rid, created=gen.created, model=req.model, choices=[], usage=gen.usage())
            )
        yield SSE_DONE
