"""Routes of `/v1/responses`: create, and by id (stored responses only) get, delete, cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from keel.entrypoints.openai.protocol import ErrorResponse
from keel.entrypoints.openai.responses.protocol import DeletedResponse, ResponseObject, ResponsesRequest

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse},
    404: {"model": ErrorResponse},
    503: {"model": ErrorResponse},
}
ResponseId = Path(min_length=1, max_length=256)


@router.post("/v1/responses", response_model=ResponseObject, responses=_ERRORS)
async def create_response(body: ResponsesRequest, raw: Request) -> Response:
    """A model response to `input`; `stream: true` answers with the Responses event stream."""
    return await raw.app.state.responses.create(body, raw)


@router.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=_ERRORS)
async def get_response(raw: Request, response_id: str = ResponseId) -> Response:
    """A response stored with `store: true`."""
    return raw.app.state.responses.get(response_id)


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse, responses=_ERRORS)
async def delete_response(raw: Request, response_id: str = ResponseId) -> Response:
    """Forget a stored response (a response in progress is cancelled first)."""
    return raw.app.state.responses.delete(response_id)


@router.post("/v1/responses/{response_id}/cancel", response_model=ResponseObject, responses=_ERRORS)
async def cancel_response(raw: Request, response_id: str = ResponseId) -> Response:
    """Stop a stored response that is still in progress."""
    return raw.app.state.responses.cancel(response_id)
