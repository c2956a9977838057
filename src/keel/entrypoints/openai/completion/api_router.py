"""Route of `POST /v1/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from keel.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse
from keel.entrypoints.openai.protocol import ErrorResponse

router = APIRouter()


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
)
async def create_completion(body: CompletionRequest, raw: Request) -> Response:
    """Complete the prompt(s); `stream: true` answers with server-sent events ending in `data: [DONE]`."""
    return await raw.app.state.completion.create(body, raw)
