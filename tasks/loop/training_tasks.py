"""The retrain's training steps (:mod:`tasks.loop.training_steps`) as Prefect tasks: the
suffix challenger and the learned ones. Each calls its plain step in one line; no result
caching."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from serving.hardware import HardwareTarget
from tasks.loop import training_steps
from tasks.loop.learned import Trained
from tasks.loop.prefect_run import retry_transient
from tasks.loop.registry_steps import open_registry


@task(name="train-suffix", cache_policy=NO_CACHE)
def train_suffix(store: Path, dataset: Path, out: Path, *, hardware: HardwareTarget) -> Path:
    """The suffix challenger from ``hardware``'s trainable records."""
    return training_steps.train_suffix(store, dataset, out, hardware=hardware)


@task(name="train-learned", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def train_learned(
    dataset: Path,
    out: Path,
    *,
    hardware: HardwareTarget,
    budgets: dict[str, float] | None = None,
    store: Path | None = None,
) -> list[Trained]:
    """The learned challengers of ``configs/retrain.yaml`` (a retry resumes each)."""
    return training_steps.train_learned(
        open_registry(), dataset, out, hardware=hardware, budgets=budgets, store_root=store
    )
