"""The loop's evaluation and promotion steps (:mod:`tasks.loop.evaluation_steps`) as
Prefect tasks: the drafts' evaluate-gate-promote and the acceptance predictor's retrain.
Each calls its plain step in one line; no result caching."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from serving.hardware import HardwareTarget
from tasks.loop import evaluation_steps
from tasks.loop.predictor_step import PredictorOutcome
from tasks.loop.registry_steps import open_registry
from tasks.loop.results import Decision, DraftRef


@task(name="evaluate-gate-promote", cache_policy=NO_CACHE)
def evaluate_gate_promote(
    challengers: Sequence[DraftRef],
    *,
    hardware: HardwareTarget,
    workloads: list[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: Path,
    promote: bool = True,
    seed: int = 0,
    traffic: Path | None = None,
    traffic_per_workload: int = 8,
    lineage: dict[str, str] | None = None,
    pregate: bool = True,
) -> Decision:
    """Evaluate the challengers against the champion, gate them, promote the fastest."""
    return evaluation_steps.evaluate_gate_promote(
        open_registry(),
        challengers,
        hardware=hardware,
        workloads=workloads,
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=cache,
        promote=promote,
        seed=seed,
        traffic_dir=traffic,
        traffic_per_workload=traffic_per_workload,
        lineage=lineage,
        pregate=pregate,
    )


@task(name="retrain-predictor", cache_policy=NO_CACHE)
def retrain_predictor(
    dataset: Path,
    out: Path,
    *,
    hardware: HardwareTarget,
    workloads: list[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: Path,
    tags: dict[str, str] | None = None,
    promote: bool = True,
    seed: int = 0,
    traffic_per_workload: int = 8,
    key: str | None = None,
) -> PredictorOutcome:
    """Train, register and judge the acceptance predictor on the champion draft."""
    return evaluation_steps.retrain_predictor(
        open_registry(),
        dataset,
        out,
        hardware=hardware,
        workloads=workloads,
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=cache,
        tags=tags,
        promote=promote,
        seed=seed,
        traffic_per_workload=traffic_per_workload,
        key=key,
    )
