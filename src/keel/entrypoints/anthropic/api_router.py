"""Routes of Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from keel.entrypoints.anthropic.protocol import (
    AnthropicError,
    CountTokensRequest,
    MessageObject,
    MessagesRequest,
    TokenCount,
)

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {400: {"model": AnthropicError}, 404: {"model": AnthropicError}}


@router.post("/v1/messages", response_model=MessageObject, responses=_ERRORS)
async def create_message(body: MessagesRequest, raw: Request) -> Response:
    """A message answering the conversation; `stream: true` answers with Anthropic's event stream."""
    return await raw.app.state.messages.create(body, raw)


@router.post("/v1/messages/count_tokens", response_model=TokenCount, responses=_ERRORS)
async def count_tokens(body: CountTokensRequest, raw: Request) -> Response:
    """The prompt tokens /v1/messages would run for this conversation."""
    return await raw.app.state.messages.count_tokens(body)
