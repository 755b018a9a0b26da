"""The app's lifetime: the scheduler starts with it and stops with it (captures flushed),
and a housekeeping task polls the champion and the cascade's predictor, flushes old
captures and refreshes the queue gauges meanwhile."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from serving.server.state import ServerState

log = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.server
    state.scheduler.start()
    background = [asyncio.create_task(housekeeping(state))]
    try:
        yield
    finally:
        for task in background:
            task.cancel()
        await asyncio.to_thread(state.scheduler.stop)
        state.capture.flush()


async def housekeeping(state: ServerState, tick_s: float = 0.5) -> None:
    """Poll the champion source, flush old captures, refresh the queue gauges."""
    config, metrics = state.config, state.metrics
    next_poll = time.monotonic() + config.champion.poll_s
    next_predictor_poll = time.monotonic() + config.cascade.poll_s
    while True:
        await asyncio.sleep(tick_s)
        try:
            metrics.set_queue(running=state.scheduler.running, waiting=state.scheduler.waiting)
            await asyncio.to_thread(state.capture.flush_if_old)
            if config.champion.source != "static" and time.monotonic() >= next_poll:
                swapped = await asyncio.to_thread(state.watcher.poll)
                next_poll = time.monotonic() + config.champion.poll_s
                if swapped:
                    current = state.watcher.current
                    metrics.labels(metrics.swaps).inc()
                    metrics.set_draft(
                        current.version, str(current.plan.drafter), current.evaluated_acceptance
                    )
            if state.predictors is not None and time.monotonic() >= next_predictor_poll:
                await asyncio.to_thread(state.predictors.poll)
                next_predictor_poll = time.monotonic() + config.cascade.poll_s
        except Exception:  # housekeeping must outlive any one failure
            log.exception("server housekeeping failed; retrying")
