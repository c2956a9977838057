"""vLLM's `POST /tokenize` and `POST /detokenize` (same request and response shapes) and `GET /version`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from keel import __version__ as keel_version
from keel.entrypoints.openai.chat_completion.protocol import ChatMessage, Tool
from keel.entrypoints.openai.chat_utils import ChatInputError, chat_job
from keel.entrypoints.openai.errors import bad_request
from keel.entrypoints.openai.protocol import ErrorResponse, OpenAIBaseModel, ResponseModel

router = APIRouter()


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(ResponseModel):
    prompt: str


def _serving(raw: Request, model: str | None) -> Any:
    serving = raw.app.state.serving
    serving.check_model(model)
    return serving


@router.post(
    "/tokenize",
    response_model=TokenizeResponse,
    responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
)
async def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest, raw: Request) -> TokenizeResponse:
    """Token ids of a prompt, or of a conversation rendered with the chat template (vLLM's shapes): tokenized
    off the event loop, and a 400 without tokenizing when the text is longer than the context could hold."""
    s = _serving(raw, body.model)
    field = "prompt"
    if isinstance(body, TokenizeChatRequest):
        s.check_chat_template(body.chat_template)
        try:
            job = chat_job(
                s.tokenizer,
                [m.for_template() for m in body.messages],
                tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                chat_template=body.chat_template,
                chat_template_kwargs=body.chat_template_kwargs,
            )
        except ChatInputError as exc:
            raise bad_request(str(exc), exc.field) from exc
        except ValueError as exc:
            raise bad_request(f"cannot apply the chat template: {exc}", "messages") from exc
        text, field = await s.render_template(job), "messages"
    else:
        text = body.prompt
    ids = await s.encode(text, add_special_tokens=body.add_special_tokens, field=field)
    strs = await s.tokens.token_strs(ids) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=s.config.max_model_len, tokens=ids, token_strs=strs)


@router.post(
    "/detokenize",
    response_model=DetokenizeResponse,
    responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
)
async def detokenize(body: DetokenizeRequest, raw: Request) -> DetokenizeResponse:
    """The text of token ids (vLLM's shape), decoded off the event loop."""
    s = _serving(raw, body.model)
    vocab = s.config.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"tokens has ids outside [0, {vocab}) (the vocabulary): {bad[:8]}", "tokens")
    return DetokenizeResponse(prompt=await s.tokens.decode(body.tokens))


@router.get("/version")
async def version() -> dict[str, str]:
    """keel's version (vLLM answers {"version": ...} here too)."""
    return {"version": keel_version}
