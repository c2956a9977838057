"""`/v1/completions`: tokenize the prompt(s), run them, answer whole or as SSE chunks.

`echo` puts the prompt's text (and, with `logprobs`, its tokens and their logprobs from the prefill:
the first one null) before the completion; `max_tokens: 0` with `echo` is a scoring request (prefill
only), the shape evaluation harnesses use for loglikelihood scoring.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from keel.entrypoints.openai.completion.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionStreamResponse,
)
from keel.entrypoints.openai.generation import SSE_DONE, Choice, Generation, sse
from keel.entrypoints.openai.logprobs import completion_logprobs, vllm_prompt_logprobs
from keel.entrypoints.openai.serving_engine import EngineRequest, OpenAIServing, client_of, constraints_of


class OpenAIServingCompletion:
    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving

    async def create(self, req: CompletionRequest, raw: Request) -> Response:
        s = self.serving
        prompt_lp = req.prompt_logprobs
        if req.echo and req.logprobs is not None:
            prompt_lp = max(req.logprobs, prompt_lp or 0)
        if req.max_tokens == 0 and prompt_lp is None:
            prompt_lp = 0  # echo without logprobs: the engine's scoring path (prefill only)
        gen = await s.generate(
            EngineRequest(
                kind="cmpl",
                model=req.model,
                prompts=list(req.prompts),
                sampling=req.sampling_fields(
                    max_tokens=req.max_tokens, logprobs=req.logprobs, prompt_logprobs=prompt_lp
                ),
                n=req.n,
                best_of=req.best_of,
                default_max_tokens=16,
                add_special_tokens=req.add_special_tokens,
                truncate_prompt_tokens=req.truncate_prompt_tokens,
                constraints=constraints_of(req),
                request_id=req.request_id,
                client=client_of(raw),
                connection=raw,
            )
        )
        texts = await self._prompt_texts(req, gen) if req.echo else []
        return await s.respond(
            raw,
            req.stream,
            gen,
            lambda: self._events(req, gen, texts),
            lambda: CompletionResponse(
                id=gen.request_id,
                created=gen.created,
                model=req.model,
                choices=[self._choice(req, c, texts[c.prompt_index] if texts else "") for c in gen.ordered()],
                usage=gen.usage(),
            ),
        )

    async def _prompt_texts(self, req: CompletionRequest, gen: Generation) -> list[str]:
        """What echo puts before each completion: the prompt as sent, or its (truncated) tokens decoded."""
        first = {c.prompt_index: c for c in sorted(gen.choices.values(), key=lambda c: -c.index)}
        texts: list[str] = []
        for i, p in enumerate(req.prompts):
            if isinstance(p, str) and req.truncate_prompt_tokens is None:
                texts.append(p)
            else:
                texts.append(await self.serving.tokens.decode(first[i].prompt_token_ids))
        return texts

    def _extras(self, req: CompletionRequest, c: Choice) -> dict[str, Any]:
        extras: dict[str, Any] = {}
        if req.prompt_logprobs is not None:
            extras["prompt_logprobs"] = vllm_prompt_logprobs(c.prompt_logprobs)
        if req.return_token_ids:
            extras["prompt_token_ids"] = c.prompt_token_ids
            extras["token_ids"] = c.token_ids
        return extras

    def _prompt_part(self, req: CompletionRequest, c: Choice) -> tuple[dict[str, Any] | None, int]:
        """The echoed prompt's logprobs (when asked) and the text offset after it."""
        if req.logprobs is None:
            return None, 0
        steps = c.prompt_logprobs or [None] * len(c.prompt_token_ids)
        return completion_logprobs(
            c.prompt_token_ids, steps, req.logprobs, self.serving.tokenizer, 0, bool(req.return_tokens_as_token_ids)
        )

    def _choice(self, req: CompletionRequest, c: Choice, prompt_text: str) -> CompletionChoice:
        text, logprobs = c.text, None
        if req.logprobs is not None:
            offset, head = 0, None
            if req.echo:
                head, offset = self._prompt_part(req, c)
            tail, _ = completion_logprobs(
                c.token_ids,
                list(c.logprobs),
                req.logprobs,
                self.serving.tokenizer,
                offset,
                bool(req.return_tokens_as_token_ids),
            )
            logprobs = _join(head, tail)
        if req.echo:
            text = prompt_text + text
        return CompletionChoice(
            index=c.index, text=text, logprobs=logprobs, finish_reason=_finish(c), **self._extras(req, c)
        )

    async def _events(self, req: CompletionRequest, gen: Generation, texts: list[str]) -> AsyncIterator[str]:
        rid = gen.request_id
        offsets: dict[int, int] = {}  # choice -> text offset of its next token
        echoed: set[int] = set()
        as_ids = bool(req.return_tokens_as_token_ids)

        def chunk(choice: CompletionChoice) -> str:
            usage: dict[str, Any] = {}
            if req.include_usage:
                usage["usage"] = gen.usage() if req.continuous_usage else None
            return sse(
                CompletionStreamResponse(id=rid, created=gen.created, model=req.model, choices=[choice], **usage)
            )

        async for c, out in gen.outputs():
            text, logprobs = out.delta_text, None
            extras: dict[str, Any] = {}
            if c.index not in echoed:  # the first output of a choice: the echoed prompt, vLLM's prompt_logprobs
                echoed.add(c.index)
                extras = self._extras(req, c)
                extras.pop("token_ids", None)
                if req.echo:
                    text = texts[c.prompt_index] + text
                    head, offsets[c.index] = self._prompt_part(req, c)
                    logprobs = head
            if req.logprobs is not None and out.new_token_ids:
                new = list(out.new_logprobs or [])
                tail, offsets[c.index] = completion_logprobs(
                    out.new_token_ids, new, req.logprobs, self.serving.tokenizer, offsets.get(c.index, 0), as_ids
                )
                logprobs = _join(logprobs, tail)
            if req.return_token_ids and out.new_token_ids:
                extras["token_ids"] = out.new_token_ids
            if not text and not out.finished and logprobs is None and not extras:
                continue  # a token that completes no character yet (or held back for a stop string)
            yield chunk(
                CompletionChoice(
                    index=c.index,
                    text=text,
                    logprobs=logprobs if req.logprobs is not None else None,
                    finish_reason=_finish(c) if out.finished else None,
                    **extras,
                )
            )
        if req.include_usage:
            yield sse(
                CompletionStreamResponse(id=rid, created=gen.created, model=req.model, choices=[], usage=gen.usage())
            )
        yield SSE_DONE


def _finish(c: Choice) -> Any:
    return "length" if c.finish_reason == "length" else c.finish_reason


def _join(head: dict[str, Any] | None, tail: dict[str, Any]) -> dict[str, Any]:
    if head is None:
        return tail
    return {k: head[k] + tail[k] for k in tail}
