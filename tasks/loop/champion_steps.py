"""The steps of ``collect`` that judge a hardware target's champion, as plain typed
functions over the view of the store its validation left
(:class:`tasks.data.store_view.StoreView`: the target's validated records and, on a vLLM
target, the windows scraped from vLLM's counters), so that none reads the store again: the
watch (:mod:`tasks.loop.watch`), the shadow scores (:mod:`tasks.loop.shadow`) and the
retrain trigger (:mod:`tasks.loop.triggers`). Prefect wraps each in
:mod:`tasks.loop.champion_tasks`.

Their settings are ``configs/retrain.yaml``'s (:func:`tasks.loop.retrain_config
.load_retrain_config`, read when each runs).
"""

from __future__ import annotations

from pathlib import Path

from registry.client import DraftVersion, Registry, RegistryError
from serving.hardware import HardwareTarget
from tasks.data.acceptance import PooledAcceptance, rolling_acceptance
from tasks.data.store_view import StoreView
from tasks.loop import retrain_config, targets
from tasks.loop.prefect_run import run_log
from tasks.loop.registry_steps import open_registry
from tasks.loop.shadow import Shadow
from tasks.loop.triggers import ChampionTrigger, decide_retrain
from tasks.loop.watch import Watch, WatchSettings, judge, judge_scraped

# A shadow contender: its role, its package folder, its version's tags.
Role = tuple[str, Path, dict[str, str]]


def watch_champion(registry: Registry, view: StoreView) -> Watch:
    """The watched champion (:mod:`tasks.loop.watch`): judge the champion of the view's
    hardware target on the requests it served (on a vLLM target, also on the windows its
    deployment scraped from vLLM's counters); when it collapsed, restore the previous
    champion (the judged one expected under the target's lock, the displaced version held
    out of promotion), or raise the alarm when there is none to restore."""
    settings = retrain_config.load_retrain_config().watch
    hardware = view.hardware.name
    champion = registry.champion(hardware)
    if champion is None or not settings.enabled:
        label = None if champion is None else champion.label
        return Watch(champion=label, collapsed=False, reasons=[])
    collapsed, reasons = _judged(view, champion, settings)
    if not collapsed:
        return Watch(champion=champion.label, collapsed=False, reasons=reasons)
    reason = "watch: live acceptance collapsed: " + "; ".join(reasons)
    try:
        restored = registry.rollback(
            hardware, reason=reason, expected_champion=champion.label, hold=True
        )
    except RegistryError as error:
        alarm = f"{champion.label} collapsed and was not rolled back: {error}"
        return Watch(champion=champion.label, collapsed=True, reasons=reasons, alarm=alarm)
    return Watch(
        champion=champion.label, collapsed=True, reasons=reasons, rolled_back_to=restored.label
    )


def _judged(
    view: StoreView, champion: DraftVersion, settings: WatchSettings
) -> tuple[bool, list[str]]:
    """Whether ``champion`` collapsed on the view's records it served and, on a vLLM
    target, on the windows scraped while it served; one line per judged group."""
    label, tags = champion.label, champion.tags
    collapsed, reasons = judge(
        view.served_by(label),
        hardware=view.hardware,
        champion=label,
        champion_tags=tags,
        settings=settings,
    )
    scraped = view.scraped(label, window=settings.newest)  # vLLM's own counters
    low, lines = judge_scraped(
        scraped[0] if scraped else None, champion=label, champion_tags=tags, settings=settings
    )
    return collapsed or low, reasons + lines


def shadow_scores(view: StoreView, cache: Path, registry: Registry | None = None) -> Shadow:
    """Shadow scores (:mod:`tasks.loop.shadow`): the champion, the previous champion and
    the registered challengers of the view's hardware target (packages downloaded into
    ``cache``) replayed over its newest records, logged to MLflow. A failure, opening the
    registry (default: :func:`~tasks.loop.registry_steps.open_registry`) included, is
    logged and returned, never raised: collect goes on."""
    from registry.shadow import log_shadow
    from tasks.loop.shadow import as_metrics
    from tasks.loop.shadow import shadow_scores as score

    settings = retrain_config.load_retrain_config().shadow
    hardware = view.hardware.name
    if not settings.enabled:
        return Shadow(hardware=hardware, scores=[], skipped={}, error="shadow.enabled is false")
    try:
        registry = registry or open_registry()
        roles = _contenders(registry, view.hardware, cache)
        if not roles:
            return Shadow(hardware=hardware, scores=[], skipped={})
        target = targets.target_for(targets.engine_of(view.hardware))
        scores, skipped = score(view.records, roles, target=target, settings=settings)
        run_id = None
        if scores:
            by_label = {label: role for label, (role, _, _) in roles.items()}
            run_id = log_shadow(
                registry, hardware, as_metrics(scores), roles=by_label, skipped=skipped
            )
        return Shadow(hardware=hardware, scores=scores, skipped=skipped, run_id=run_id)
    except Exception as error:  # a shadow score is advice: collect goes on without it
        run_log().warning("shadow scores on %s failed: %s", hardware, error)
        return Shadow(hardware=hardware, scores=[], skipped={}, error=str(error))


def _contenders(registry: Registry, hardware: HardwareTarget, cache: Path) -> dict[str, Role]:
    """Label -> role, package and tags of the champion, the previous champion and the
    challengers of ``hardware`` (each once, in that order of roles)."""
    name = hardware.name  # the registry's key
    roles: dict[str, Role] = {}
    for role, drafts in (
        ("champion", [registry.champion(name)]),
        ("previous champion", [registry.previous_champion(name)]),
        ("challenger", registry.challengers(name)),
    ):
        for draft in drafts:
            if draft is not None and draft.label not in roles:
                roles[draft.label] = (role, registry.download(draft, cache), draft.tags)
    return roles


def retrain_trigger(
    registry: Registry,
    view: StoreView,
    *,
    absolute: float,
    now: float,
    window: int = 50,
    cooldown_minutes: float | None = None,
) -> ChampionTrigger:
    """Whether the champion's rolling acceptance on the view's records wants a retrain,
    relative to what it accepted when evaluated, outside the cool-down (default
    ``configs/retrain.yaml``'s). Only the requests the current champion served count: after
    a promotion, the previous champion's records say nothing about the new one. On a vLLM
    target the windows its deployment scraped from vLLM's counters count too
    (:mod:`tasks.data.vllm_acceptance`)."""
    from registry.history import last_retrain

    config = retrain_config.load_retrain_config()
    hardware = view.hardware.name
    champion = registry.champion(hardware)
    label = None if champion is None else champion.label
    groups: list[PooledAcceptance] = list(rolling_acceptance(view.served_by(label), window=window))
    groups += view.scraped(label, window=window)  # vLLM's own counters
    cooldown = config.cooldown_minutes if cooldown_minutes is None else cooldown_minutes
    trigger = decide_retrain(
        groups,
        hardware=view.hardware,
        champion_tags=None if champion is None else champion.tags,
        relative=config.relative_threshold,
        absolute=absolute,
        last_retrain_at=last_retrain(registry, hardware),
        cooldown_s=60.0 * cooldown,
        now=now,
    )
    return ChampionTrigger(**dict(trigger), champion=label)
