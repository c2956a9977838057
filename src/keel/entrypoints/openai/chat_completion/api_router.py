"""Route of `POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from keel.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest, ChatCompletionResponse
from keel.entrypoints.openai.protocol import ErrorResponse

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    """Answer the conversation; `stream: true` answers with server-sent events ending in `data: [DONE]`."""
    return await raw.app.state.chat.create(body, raw)
