"""The loop's data steps (:mod:`tasks.loop.data_steps`) as Prefect tasks: replay traffic,
retention, validation, versioning. Each calls its plain step in one line; retries where a
retry can help (:func:`~tasks.loop.prefect_run.retry_transient`), no result caching (every
step reads state that changes: the store, the registry)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from serving.hardware import HardwareTarget
from tasks.data.prompts import SplitSelector
from tasks.data.retention import RetentionReport
from tasks.loop import data_steps
from tasks.loop.data_steps import Validated
from tasks.loop.prefect_run import retry_transient
from tasks.loop.registry_steps import open_registry
from tasks.loop.results import Replayed


@task(name="replay-traffic", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def replay_traffic(
    workload: str,
    n: int,
    *,
    hardware: HardwareTarget,
    store: Path,
    run_id: str,
    max_new_tokens: int,
    seed: int = 0,
    split: SplitSelector = "train",
) -> Replayed:
    """Serve ``n`` prompts of ``workload`` with the current champion, detailed mode."""
    return data_steps.replay_workload(
        open_registry(),
        workload,
        n,
        hardware=hardware,
        store_root=store,
        run_id=run_id,
        max_new_tokens=max_new_tokens,
        seed=seed,
        split=split,
    )


@task(name="retention", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def retention(store: Path, dataset: Path, *, days: float | None, now: float) -> RetentionReport:
    """Remove the store's traffic older than ``days`` (default: ``configs/store.yaml``) and
    the dataset's copies of it, before validation (a retry finishes a killed run)."""
    return data_steps.retention_step(store, dataset, days=days, now=now)


@task(name="validate", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def validate(
    store: Path,
    dataset: Path,
    *,
    hardware: HardwareTarget,
    window: int = 50,
    threshold: float = 0.5,
    full: bool = False,
) -> Validated:
    """Validate the parts new since the last run (all of them with ``full``), rebuild the
    dataset from every valid record, and view ``hardware``'s for the champion's steps."""
    return data_steps.validate_step(
        store, dataset, hardware=hardware, window=window, threshold=threshold, full=full
    )


@task(
    name="version",
    cache_policy=NO_CACHE,
    retries=2,
    retry_condition_fn=retry_transient,
    retry_delay_seconds=5,
)
def version(store: Path) -> str | None:
    """The store's new DVC version, pushed; None while nothing was captured."""
    return data_steps.version_step(store)
