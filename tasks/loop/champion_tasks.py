"""The steps of ``collect`` that judge the champion (:mod:`tasks.loop.champion_steps`) as
Prefect tasks, each over the view of the store validation left: the watch, the shadow
scores, the retrain trigger. Each calls its plain step in one line; no result caching."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.data.store_view import StoreView
from tasks.loop import champion_steps
from tasks.loop.prefect_run import retry_transient
from tasks.loop.registry_steps import open_registry
from tasks.loop.shadow import Shadow
from tasks.loop.triggers import ChampionTrigger
from tasks.loop.watch import Watch


@task(name="watch-champion", cache_policy=NO_CACHE)
def watch_champion(view: StoreView) -> Watch:
    """Judge the champion on what it served; roll it back when it collapsed."""
    return champion_steps.watch_champion(open_registry(), view)


@task(name="shadow-scores", cache_policy=NO_CACHE)
def shadow_scores(view: StoreView, cache: Path) -> Shadow:
    """The registered drafts replayed over the newest records (never raises)."""
    return champion_steps.shadow_scores(view, cache)


@task(name="retrain-trigger", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def retrain_trigger(
    view: StoreView,
    *,
    absolute: float,
    now: float,
    window: int = 50,
    cooldown_minutes: float | None = None,
) -> ChampionTrigger:
    """Whether the champion's rolling acceptance wants a retrain, outside the cool-down."""
    return champion_steps.retrain_trigger(
        open_registry(),
        view,
        absolute=absolute,
        now=now,
        window=window,
        cooldown_minutes=cooldown_minutes,
    )
