"""Readiness of a replica (what `GET /v1/models` answers to orchestrators): the model is loaded and the engine
has run a step. `keel serve` sends a one-token warm-up request at start so that a step happens without traffic."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI

from keel.engine.async_engine import AsyncEngine
from keel.engine.sampling_params import SamplingParams
from keel.entrypoints.openai.errors import log


def is_ready(app: FastAPI) -> bool:
    """Readiness: the model is loaded (it is, once the app exists) and the engine has run a step. The
    first call on an app that is not ready starts the warm-up request (`warm_up`) if nothing did."""
    if app.state.ready:
        return True
    if app.state.engine.steps > 0:
        app.state.ready = True
        return True
    start_warm_up(app)
    return False


def start_warm_up(app: FastAPI) -> None:
    """Start the warm-up request once, on the running event loop."""
    if app.state.warm_up is None and not app.state.ready:
        app.state.warm_up = asyncio.ensure_future(warm_up(app))


async def warm_up(app: FastAPI) -> None:
    """One greedy one-token request through the engine (so the first client does not pay the first step's
    one-time costs, and readiness means a request has gone through the model)."""
    engine: AsyncEngine = app.state.engine
    try:
        stream = await engine.open(["keel-warm-up"], [[0]], [SamplingParams(max_tokens=1)])
        try:
            async for _ in stream:
                pass
        finally:
            stream.close()
    except Exception as exc:  # the engine is broken: /health says so; stay unready and say why in the log
        log.error("keel serve: the warm-up request failed: %r", exc)
        return
    app.state.ready = True
