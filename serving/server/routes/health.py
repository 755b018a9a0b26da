"""The server's own endpoints: ``/health`` (always open), ``/metrics`` (Prometheus) and
``/v1/models`` (the served model and its draft)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from serving.server.deps import ServerStateDep
from serving.server.responses import DraftInfo, Health, ModelCard, ModelList

router = APIRouter()


@router.get("/health", response_model=Health)
async def health(state: ServerStateDep) -> Health:
    watcher = state.watcher
    return Health(
        model=state.config.model_name,
        hardware=state.config.hardware,
        draft=DraftInfo.model_validate(watcher.current.describe()),
        draft_swaps=watcher.swaps,
        champion_error=watcher.last_error,
        requests_running=state.scheduler.running,
        requests_waiting=state.scheduler.waiting,
    )


@router.get("/metrics")
async def prometheus(state: ServerStateDep) -> Response:
    state.metrics.set_queue(running=state.scheduler.running, waiting=state.scheduler.waiting)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/models", response_model=ModelList)
async def models(state: ServerStateDep) -> ModelList:
    current = state.watcher.current
    card = ModelCard(
        id=state.config.model_name,
        created=int(current.loaded_at or 0),
        max_model_len=state.max_context,
        draft=DraftInfo.model_validate(current.describe()),
    )
    return ModelList(data=[card])
