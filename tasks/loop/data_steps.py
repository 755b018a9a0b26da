"""The loop's data steps as plain typed functions: replay traffic through the champion,
remove the traffic past its retention age, validate the store (and view it for the steps
that judge the champion), version it with DVC. Prefect wraps each in
:mod:`tasks.loop.data_tasks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from registry.client import Registry
from serving.engine.build import build_decoder
from serving.engine.drafters.package import load_package
from serving.hardware import HardwareTarget
from tasks.data import traffic
from tasks.data.collect import CollectSummary, collect
from tasks.data.curate import CurateSummary, curate_records
from tasks.data.prompts import Prompt, SplitSelector
from tasks.data.retention import RetentionReport
from tasks.data.store_view import StoreView
from tasks.loop import targets
from tasks.loop.prefect_run import run_log
from tasks.loop.registry_steps import champion_package
from tasks.loop.results import Replayed
from tasks.settings import loop_settings


def replay_traffic(
    prompts: Sequence[Prompt],
    *,
    package: Path,
    draft_label: str,
    store_root: Path,
    run_id: str,
    hardware: HardwareTarget,
    max_new_tokens: int,
    failure_threshold: float = 0.5,
    progress: bool = True,
) -> CollectSummary:
    """Serve ``prompts`` with the champion package on ``hardware`` in detailed mode; append
    their records (re-running with the same ``run_id`` skips what is already stored)."""
    target = targets.target_for(hardware)
    manifest, drafter = load_package(package, target)
    decoder = build_decoder(target, manifest.plan(Path(package)), drafter=drafter)
    return collect(
        prompts,
        decoder=decoder,
        tokenizer=target.tokenizer,
        store_root=store_root,
        run_id=run_id,
        hardware=hardware,
        drafter_version=draft_label,
        max_new_tokens=max_new_tokens,
        failure_threshold=failure_threshold,
        progress=progress,
    )


def replay_workload(
    registry: Registry,
    workload: str,
    n: int,
    *,
    hardware: HardwareTarget,
    store_root: Path,
    run_id: str,
    max_new_tokens: int,
    seed: int = 0,
    split: SplitSelector = "train",
) -> Replayed:
    """Serve ``n`` prompts of ``workload`` with ``hardware``'s current champion, detailed
    mode (:func:`replay_traffic`)."""
    from serving.models.real import cache_root

    # Versions never change: one download cache per machine, shared with the server.
    draft, package = champion_package(registry, hardware, cache_root() / "registry")
    prompts = traffic.build_workload(workload, n, seed=seed, split=split)
    summary = replay_traffic(
        prompts,
        package=package,
        draft_label=draft.label,
        store_root=store_root,
        run_id=run_id,
        hardware=targets.engine_of(hardware),
        max_new_tokens=max_new_tokens,
    )
    return Replayed(**dict(summary), champion=draft.label)


def retention_step(
    store_root: Path, dataset_dir: Path, *, days: float | None = None, now: float
) -> RetentionReport:
    """Remove the store's traffic older than ``days`` (default ``configs/store.yaml``'s
    ``retention.days``) and every copy the dataset folder's validation kept of it: run
    before validation (:mod:`tasks.data.retention`)."""
    from tasks.data.retention import apply_retention, check_days, load_store_config

    days = load_store_config().retention.days if days is None else check_days(days)
    return apply_retention(store_root, [dataset_dir], max_age_days=days, now=now)


@dataclass(frozen=True)
class Validated:
    """What the validate step gives: its summary (the flows' ``validation``) and the view
    of the store it leaves for the steps that judge the champion."""

    summary: CurateSummary
    view: StoreView


def validate_step(
    store_root: Path,
    out_dir: Path,
    *,
    hardware: HardwareTarget,
    window: int = 50,
    threshold: float = 0.5,
    full: bool = False,
) -> Validated:
    """Great Expectations validation with quarantine, the dataset, rolling acceptance
    (:func:`tasks.data.curate.curate_records`); validates only the parts earlier runs into
    ``out_dir`` did not (``full``: all). The view holds ``hardware``'s validated records
    from that validation, read no second time (:class:`tasks.data.store_view.StoreView`)."""
    curated = curate_records(store_root, out_dir, window=window, threshold=threshold, full=full)
    return Validated(curated.summary, StoreView.of(store_root, hardware, curated.valid))


def version_step(store_root: Path) -> str | None:
    """The store's new DVC version, pushed; None while nothing was captured (a scheduled
    collect on a fresh deployment finds no store yet)."""
    from tasks.data.version import version_store

    if not store_root.is_dir():
        run_log().warning("nothing captured yet: no store at %s to version", store_root)
        return None
    return version_store(store_root, remote=loop_settings().dvc_remote)
