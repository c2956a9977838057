"""Routes of `GET /v1/models` and `GET /v1/models/{model}`: the one model this server serves."""

from __future__ import annotations

from fastapi import APIRouter, Request

from keel.entrypoints.openai.errors import APIError
from keel.entrypoints.openai.protocol import ModelCard, ModelList
from keel.entrypoints.openai.readiness import is_ready

router = APIRouter()


def _card(raw: Request) -> ModelCard:
    if not is_ready(raw.app):  # readiness: orchestrators probe /v1/models, liveness is /health
        raise APIError(
            503, "the model is loaded but the engine has not run a step yet (warming up); retry", code="not_ready"
        )
    cfg = raw.app.state.serving.config
    return ModelCard(id=cfg.model_name, created=raw.app.state.started, max_model_len=cfg.max_model_len)


@router.get("/v1/models", response_model=ModelList)
async def list_models(raw: Request) -> ModelList:
    return ModelList(data=[_card(raw)])


@router.get("/v1/models/{model:path}", response_model=ModelCard)
async def retrieve_model(model: str, raw: Request) -> ModelCard:
    card = _card(raw)
    if model != card.id:
        raise APIError(404, f"The model `{model}` does not exist", param="model", code="model_not_found")
    return card
