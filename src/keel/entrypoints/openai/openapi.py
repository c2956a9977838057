"""The OpenAPI document of `keel serve`: FastAPI's, generated from the request models that validate, with
what FastAPI gets wrong for this server put right.

- Validation errors are sent as 400 (OpenAI's status, `errors.install_handlers`), so the 422 FastAPI
  documents is replaced by a 400 with OpenAI's error body.
- Every status the guard or the handlers can send on a route is documented: 401 (with a key), 404,
  405, 408, 413, 503, and 500 for an engine failure of that one request.
- The limits the server knows at start go into the request schemas: `max_tokens` at most the
  server's limit, token ids below the vocabulary size, `logit_bias` keys ASCII digits.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from keel.entrypoints.openai.errors import ANTHROPIC_PATHS

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_ANTHROPIC_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/AnthropicError"}}}}
_STATUSES = {
    "400": "Invalid request: `error.param` names the field",
    "404": "Unknown model or route",
    "405": "Method not allowed (`Allow` lists the route's methods)",
    "408": "The request body did not arrive within the body timeout",
    "413": "The request body is larger than the server's limit",
    "500": "The engine failed this request",
    "503": "Overloaded, shutting down, or the engine stopped; retry later",
}
_REQUESTS = ("CompletionRequest", "ChatCompletionRequest", "ResponsesRequest", "MessagesRequest")
_TOKEN_LISTS = ("stop_token_ids", "allowed_token_ids")


def _integer_branch(prop: dict[str, Any]) -> list[dict[str, Any]]:
    """The integer schema(s) of a property that may be `int | None` (pydantic writes an anyOf)."""
    return [b for b in [prop, *prop.get("anyOf", [])] if b.get("type") == "integer"]


def _array_items(prop: dict[str, Any]) -> list[dict[str, Any]]:
    return [b["items"] for b in [prop, *prop.get("anyOf", [])] if b.get("type") == "array" and "items" in b]


def server_openapi(app: FastAPI, *, max_tokens: int, vocab_size: int, api_key: bool) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    statuses = dict(_STATUSES)
    if api_key:
        statuses["401"] = "Missing or wrong API key (`Authorization: Bearer <key>`)"
    open_paths = {"/health", "/version", "/metrics"}
    for path, ops in schema.get("paths", {}).items():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status, text in statuses.items():
                if status == "401" and path in open_paths:
                    continue
                if status in ("400", "408", "413") and "requestBody" not in op:
                    continue
                error = _ANTHROPIC_ERROR if path.startswith(ANTHROPIC_PATHS) else _ERROR
                responses.setdefault(status, {"description": text, **error})
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    if "ErrorResponse" not in components:  # referenced above: generate it from the model
        from keel.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

        components["ErrorInfo"] = ErrorInfo.model_json_schema()
        components["ErrorResponse"] = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
        components["ErrorResponse"].pop("$defs", None)
    for name in _REQUESTS:
        props = components.get(name, {}).get("properties", {})
        for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            for branch in _integer_branch(props.get(field, {})):
                branch["maximum"] = max_tokens
        for field in _TOKEN_LISTS:
            for items in _array_items(props.get(field, {})):
                if items.get("type") == "integer":
                    items.update(minimum=0, maximum=vocab_size - 1)
        for branch in [props.get("logit_bias", {}), *props.get("logit_bias", {}).get("anyOf", [])]:
            if branch.get("type") == "object":
                branch["propertyNames"] = {"pattern": "^[0-9]+$"}
    return schema


def install_openapi(app: FastAPI, *, max_tokens: int, vocab_size: int, api_key: bool) -> None:
    """Serve `server_openapi` at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = server_openapi(app, max_tokens=max_tokens, vocab_size=vocab_size, api_key=api_key)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
