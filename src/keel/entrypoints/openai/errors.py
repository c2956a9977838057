"""Errors in OpenAI's body (`{"error": {"message", "type", "param", "code"}}`) with the right status, and in
Anthropic's (`{"type": "error", "error": {"type", "message"}}`) on the Messages API's paths (`ANTHROPIC_PATHS`).

Every failure the server reports goes through `APIError`; the handlers here turn FastAPI's own
failures (malformed JSON, schema violations, unknown routes) into the same shape, with 400 where
FastAPI would say 422.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("keel.serve")

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "server_error",
    500: "server_error",
}


# Anthropic's error types by status (its API reference, "Errors")
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)


class APIError(Exception):
    """An error the API reports to its client."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
        body = anthropic_body(self) if path.startswith(ANTHROPIC_PATHS) else self.body()
        return JSONResponse(body, status_code=self.status, headers=headers)


def anthropic_body(err: APIError) -> dict:
    """The error in Anthropic's shape (the field it is about named in the message, as Anthropic's own errors do)."""
    kind = _ANTHROPIC_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "api_error")
    message = err.message if err.param is None or err.param in err.message else f"{err.param}: {err.message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable line per problem, `field: what was wrong`, and the first offending field."""
    parts, first = [], None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        if err.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}", None
        if err.get("type") == "model_attributes_type" and not loc:
            return "the request body must be a JSON object", None
        first = first or (where or None)
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "is not a supported parameter"
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts) or "invalid request", first


def install_handlers(app: FastAPI) -> None:
    """Route every error the app can raise into OpenAI's error body."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param, code="invalid_request").response(path=request.url.path)

    @app.exception_handler(json.JSONDecodeError)
    async def _bad_json(request: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return APIError(400, f"the request body is not valid JSON: {exc}").response(path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # keep the exception's headers: a 405 says which methods the route takes (`Allow`)
        return APIError(exc.status_code, str(exc.detail)).response(dict(exc.headers or {}), path=request.url.path)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("keel serve: internal error")
        err = APIError(500, f"internal server error: {type(exc).__name__}: {exc}")
        return err.response(path=request.url.path)
