"""The loop's registry steps (:mod:`tasks.loop.registry_steps`) as Prefect tasks: the
champion, registering drafts, promoting by hand and the drill's damage, the retrain's mark
and lineage. Each calls its plain step in one line; retries where a retry can help
(:func:`~tasks.loop.prefect_run.retry_transient`), no result caching."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from serving.hardware import HardwareTarget
from tasks.loop import registry_steps
from tasks.loop.lineage import lineage_tags
from tasks.loop.prefect_run import retry_transient
from tasks.loop.registry_steps import Param, open_registry
from tasks.loop.results import DraftRef


@task(name="champion", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def champion(hardware: HardwareTarget) -> str | None:
    """The label of ``hardware``'s champion, or None."""
    return registry_steps.champion_label(open_registry(), hardware)


@task(name="register", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def register(
    package: Path,
    family: str,
    params: dict[str, Param] | None = None,
    tags: dict[str, str] | None = None,
    curves: dict[str, list[tuple[int, float]]] | None = None,
    key: str | None = None,
) -> DraftRef:
    """Register ``package`` as a new version of ``family`` (once per ``key``)."""
    return registry_steps.register(
        open_registry(), package, family, params=params, tags=tags, curves=curves, key=key
    )


@task(
    name="register-base-head",
    cache_policy=NO_CACHE,
    retries=1,
    retry_condition_fn=retry_transient,
)
def register_base_head(hardware: HardwareTarget, work: Path) -> DraftRef | None:
    """Register ``hardware``'s shipped base head (checksums checked) once; None if it has
    none."""
    return registry_steps.register_base_head(open_registry(), hardware, work)


@task(name="builtin-package", cache_policy=NO_CACHE)
def builtin_package(drafter: str, folder: Path, *, k: int, policy: str, family: str) -> Path:
    """A draft package of a drafter that needs no files, ready to register."""
    return registry_steps.builtin_package(drafter, folder, k=k, policy=policy, family=family)


@task(name="promote-by-hand", cache_policy=NO_CACHE)
def promote_by_hand(draft: DraftRef, *, hardware: HardwareTarget, reason: str) -> str:
    """Promote ``draft`` over whatever serves now; its label."""
    return registry_steps.promote_by_hand(open_registry(), draft, hardware=hardware, reason=reason)


@task(name="drill-displaced", cache_policy=NO_CACHE)
def displaced_by(draft: DraftRef, *, hardware: HardwareTarget) -> tuple[str | None, bool]:
    """The champion a hand promotion of ``draft`` displaces, and whether it serves already."""
    return registry_steps.displaced_by(open_registry(), draft, hardware=hardware)


@task(name="scramble-champion", cache_policy=NO_CACHE)
def scramble_champion(hardware: HardwareTarget) -> list[str]:
    """Damage the serving machine's copy of the champion's weights; the files changed."""
    return registry_steps.scramble_champion(open_registry(), hardware)


@task(name="retrain-record", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_transient)
def record_retrain(hardware: HardwareTarget, slot: str, summary: dict[str, str | list[str]]) -> str:
    """Mark a retrain on ``hardware`` (the cool-down counts from it)."""
    return registry_steps.record_retrain(open_registry(), hardware, slot, summary)


@task(name="lineage", cache_policy=NO_CACHE)
def lineage(store: Path) -> dict[str, str]:
    """The data version and the git commit a retrain's challengers come from."""
    return lineage_tags(store)
