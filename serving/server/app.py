"""The OpenAI-compatible HTTP app (FastAPI): completions, chat completions, models, health,
Prometheus metrics. ``create_app`` only assembles it: the guards, the routers of
``serving/server/routes``, the error handlers of ``api_errors``; the handlers read the
:class:`ServerState` kept on ``app.state.server``."""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI

from serving.security.admission import Admission, Refusal
from serving.security.asgi import ApiKeyGuard, BodyLimit
from serving.security.rate import TokenBuckets
from serving.server.api_errors import HANDLERS
from serving.server.lifespan import lifespan
from serving.server.metrics import ServerMetrics
from serving.server.routes import completions, health
from serving.server.state import ServerState

ROUTERS = (health.router, completions.router)
DECODE_PATHS = ("/v1/completions", "/v1/chat/completions")


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="specops", lifespan=lifespan)
    app.state.server = state
    config = state.config
    rejected = partial(_count_rejection, state.metrics)
    # The middleware added last runs first: the key is checked, then the client's rate
    # and the queue's room, all before a byte of the body is read.
    app.add_middleware(BodyLimit, max_bytes=config.limits.max_body_bytes, on_reject=rejected)
    limits = config.limits
    app.add_middleware(
        Admission,
        paths=DECODE_PATHS,
        buckets=TokenBuckets(limits.rate_per_s, limits.burst) if limits.rate_per_s else None,
        keyed=state.api_keys.enabled,
        busy=partial(_queue_full, state),
        on_reject=rejected,
        delay_s=limits.refusal_delay_s,
    )
    open_paths = {"/health", *(("/metrics",) if config.security.metrics_open else ())}
    app.add_middleware(ApiKeyGuard, keys=state.api_keys, open_paths=open_paths, on_reject=rejected)
    for router in ROUTERS:
        app.include_router(router)
    for error, handler in HANDLERS:
        app.add_exception_handler(error, handler)
    return app


def _count_rejection(metrics: ServerMetrics, status: int, reason: str) -> None:
    """A request the guards refused before any handler saw it."""
    metrics.error(status)
    metrics.labels(metrics.rejected, reason=reason).inc()


def _queue_full(state: ServerState) -> Refusal | None:
    """A full queue refused before the body is parsed (the scheduler's submit still
    decides for the requests this lets through)."""
    scheduler = state.scheduler
    if not scheduler.full:
        return None
    error = scheduler.full_error()
    return Refusal("queue_full", str(error), error.retry_after_s)
