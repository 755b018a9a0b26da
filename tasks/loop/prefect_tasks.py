"""The loop's steps as Prefect tasks: each wraps one plain function of ``tasks/`` (tested
without Prefect) with a name, retries where a retry can help, and no result caching
(every step reads state that changes: the store, the registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from registry.client import Registry
from tasks.data.prompts import Prompt
from tasks.data.traffic import build_workload
from tasks.loop import steps as loop


def open_registry() -> Registry:
    return Registry()  # configs/registry.yaml, SPECOPS_MLFLOW_URI overrides


@task(name="replay-traffic", cache_policy=NO_CACHE, retries=1)
def replay_traffic(
    workload: str,
    n: int,
    *,
    hardware: str,
    store: str,
    run_id: str,
    max_new_tokens: int,
    seed: int = 0,
    split: str = "train",
) -> dict[str, Any]:
    """Serve ``n`` prompts of ``workload`` with the current champion, detailed mode."""
    registry = open_registry()
    from serving.models.real import cache_root

    # Versions never change: one download cache per machine, shared with the server.
    draft, package = loop.champion_package(registry, hardware, cache_root() / "registry")
    prompts = build_workload(workload, n, seed=seed, split=split)  # type: ignore[arg-type]
    summary = loop.replay_traffic(
        prompts,
        package=package,
        draft_label=draft.label,
        store_root=Path(store),
        run_id=run_id,
        hardware=hardware,
        max_new_tokens=max_new_tokens,
    )
    return {**summary.to_dict(), "champion": draft.label}


@task(name="validate", cache_policy=NO_CACHE, retries=1)
def validate(store: str, out: str, *, window: int = 50, threshold: float = 0.5) -> dict[str, Any]:
    return loop.validate_store_step(Path(store), Path(out), window=window, threshold=threshold)


@task(name="version", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def version(store: str) -> str:
    from tasks.data.version import version_store

    return version_store(Path(store))


@task(name="train-suffix", cache_policy=NO_CACHE)
def train_suffix(store: str, out: str, *, hardware: str) -> str:
    return str(loop.train_suffix_challenger(Path(store), Path(out), hardware=hardware))


@task(name="builtin-package", cache_policy=NO_CACHE)
def builtin_package(drafter: str, folder: str, *, k: int, policy: str, family: str) -> str:
    return str(loop.builtin_package(drafter, Path(folder), k=k, policy=policy, family=family))


@task(name="champion", cache_policy=NO_CACHE, retries=1)
def champion(hardware: str) -> str | None:
    """The label of ``hardware``'s champion, or None."""
    draft = open_registry().champion(hardware)
    return None if draft is None else draft.label


@task(name="register", cache_policy=NO_CACHE, retries=1)
def register(package: str, family: str, params: dict[str, Any] | None = None) -> dict[str, str]:
    draft = open_registry().log_draft(package, family=family, params=params)
    return {"family": draft.family, "version": draft.version, "label": draft.label}


@task(name="evaluate-gate-promote", cache_policy=NO_CACHE)
def evaluate_gate_promote(
    challengers: list[dict[str, str]],
    *,
    hardware: str,
    workloads: list[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: str,
    promote: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    registry = open_registry()
    drafts = [registry.get(c["family"], c["version"]) for c in challengers]
    prompts: list[Prompt] = [
        p
        for workload in workloads
        for p in build_workload(workload, prompts_per_workload, seed=seed, split="heldout")  # type: ignore[arg-type]
    ]
    decision = loop.evaluate_and_decide(
        registry,
        drafts,
        prompts,
        hardware=hardware,
        cache=Path(cache),
        max_new_tokens=max_new_tokens,
        promote=promote,
    )
    return decision.to_dict()
