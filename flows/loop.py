"""The loop's flows. They only wire tasks (``tasks/loop/*_tasks.py``, one module per family
of steps: data, champion, training, evaluation, registry).

- ``collect``: (optionally replay a workload through the champion,) remove the traffic
  older than the retention age (``configs/store.yaml``, :mod:`tasks.data.retention`),
  validate the store, version it with DVC, and trigger ``retrain`` when rolling
  acceptance falls below a threshold relative to the champion's evaluated acceptance,
  outside the cool-down (:mod:`tasks.loop.triggers`). Scheduled hourly.
- ``retrain``: rebuild the suffix draft and train the learned challengers of
  ``configs/retrain.yaml`` (head, LoRA) from the collected traffic, register them with
  their training curves and data lineage, then ``evaluate-and-promote`` on the held-out
  traffic and the built-in workloads; then retrain the acceptance predictor
  (``specops-predictor``) and promote it only if it makes the champion draft faster than
  the current policy (:mod:`tasks.loop.predictor_step`). Scheduled daily, and triggered
  by ``collect``.
- ``evaluate-and-promote``: one interleaved evaluation of champion and challengers on
  held-out prompts of a hardware target (and the held-out slice of collected traffic);
  the gates decide; the fastest passing challenger becomes the champion (the registry
  alias moves under a lock; servers hot-swap to it).

Run ids and work folders come from the flow run's *scheduled* start time (:func:`slot`),
not the wall clock: a retry, or a re-run of a killed run, lands in the same slot, skips the
records it already wrote and resumes training from its checkpoints.
- ``bootstrap``: a hardware target's first champion: a built-in drafter (prompt lookup by
  default) is registered and goes through ``evaluate-and-promote`` (with no champion, it
  must beat plain decoding). Run once per target, before ``collect``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY
from serving.hardware import DEFAULT_HARDWARE, hardware_target
from tasks.data.retention import RetentionReport
from tasks.loop import (
    champion_tasks,
    data_tasks,
    evaluation_tasks,
    registry_tasks,
    training_tasks,
)
from tasks.loop.results import (
    Bootstrapped,
    Collected,
    Decision,
    DeploymentRun,
    DraftRef,
    Retrained,
)
from tasks.loop.shadow import Shadow
from tasks.loop.watch import Watch
from tasks.settings import loop_settings

# A flow run rescheduled after crashes (its worker died: tasks/ops/prefect_setup.py) this
# many times stops instead of crashing again.
MAX_RUNS = 3
# Flow time limits: a run past them fails (and holds no slot, lock or worker any longer).
TIMEOUTS_S = {"collect": 3600, "retrain": 6 * 3600, "evaluate": 2 * 3600, "bootstrap": 3600}


def _check_run_count() -> None:
    from prefect.runtime import flow_run

    if (flow_run.run_count or 0) > MAX_RUNS:
        raise RuntimeError(
            f"flow run {flow_run.name} started {flow_run.run_count} times (it crashed and was "
            f"rescheduled); giving up after {MAX_RUNS}: read its logs before re-running it"
        )


def slot(resolution: str = "%Y%m%dT%H%M") -> str:
    """This flow run's scheduled start time (UTC), as a run id: the same for every retry
    of a scheduled run; a flow called directly gets its own start time."""
    from datetime import UTC, datetime

    from prefect.runtime import flow_run

    scheduled = flow_run.scheduled_start_time
    moment = datetime.now(tz=UTC) if scheduled is None else scheduled.astimezone(UTC)
    return moment.strftime(resolution)


def scheduled_timestamp() -> float:
    from datetime import UTC, datetime

    from prefect.runtime import flow_run

    scheduled = flow_run.scheduled_start_time
    return (scheduled or datetime.now(tz=UTC)).timestamp()


@flow(name="evaluate-and-promote", timeout_seconds=TIMEOUTS_S["evaluate"])
def evaluate_and_promote(
    challengers: Sequence[DraftRef],
    hardware: str = DEFAULT_HARDWARE,
    workloads: list[str] | None = None,
    prompts_per_workload: int = 8,
    max_new_tokens: int = 96,
    cache: str = ".specops/work/packages",
    promote: bool = True,
    traffic: str | None = None,
    traffic_per_workload: int = 8,
    store: str = "data",
    lineage: dict[str, str] | None = None,
    pregate: bool = True,
) -> Decision:
    """``lineage`` (default: the data version of ``store`` and the git commit) tags every
    evaluation run; ``pregate`` False times every challenger, however slow the pre-gate
    predicts it."""
    target = hardware_target(hardware)
    lineage = lineage or registry_tasks.lineage(Path(store))
    decision = evaluation_tasks.evaluate_gate_promote(
        challengers,
        hardware=target,
        workloads=workloads or ["humaneval"],
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=Path(cache),
        promote=promote,
        traffic=None if traffic is None else Path(traffic),
        traffic_per_workload=traffic_per_workload,
        lineage=lineage,
        pregate=pregate,
    )
    logger = get_run_logger()
    for label, result in decision.gates.items():
        logger.info("%s: %s", label, result.reason)
    if decision.phase_s:
        logger.info(
            "evaluation: %s", ", ".join(f"{k} {v:.0f} s" for k, v in decision.phase_s.items())
        )
    logger.info("champion on %s: %s", hardware, decision.promoted or f"kept {decision.champion}")
    return decision


@flow(name="bootstrap", timeout_seconds=TIMEOUTS_S["bootstrap"])
def bootstrap(
    hardware: str = DEFAULT_HARDWARE,
    drafter: str = "pld:3",
    family: str = "ngram",
    k: int = DEFAULT_K,
    policy: str = DEFAULT_POLICY,
    workloads: list[str] | None = None,
    prompts_per_workload: int = 4,
    max_new_tokens: int = 96,
    work: str = ".specops/work",
    store: str = "data",
) -> Bootstrapped:
    logger = get_run_logger()
    _check_run_count()
    current = registry_tasks.champion(hardware_target(hardware))
    if current is not None:
        logger.info("%s already has a champion (%s): nothing to bootstrap", hardware, current)
        return Bootstrapped(champion=current, bootstrapped=None)
    package = registry_tasks.builtin_package(
        drafter, Path(work) / "bootstrap", k=k, policy=policy, family=family
    )
    # Keyed: a bootstrap run again (it failed its gates, or crashed) reuses the version.
    draft = registry_tasks.register(
        package,
        family,
        tags=registry_tasks.lineage(Path(store)),
        key=f"{hardware}/bootstrap/{drafter}/{k}/{policy}",
    )
    candidates = [draft]
    # The shipped base head (configs/retrain.yaml `base_head`, checksums checked) joins as
    # the head family's first version: evaluated here, the first retrain continues it.
    base_head = registry_tasks.register_base_head(
        hardware_target(hardware), Path(work) / "bootstrap"
    )
    if base_head is not None:
        logger.info("the shipped base head is registered as %s", base_head.label)
        candidates.append(base_head)
    decision = evaluate_and_promote(
        candidates,
        hardware=hardware,
        workloads=workloads or ["grounded"],
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=f"{work}/packages",
        store=store,
    )
    return Bootstrapped(champion=decision.promoted, bootstrapped=decision)


@flow(name="retrain", timeout_seconds=TIMEOUTS_S["retrain"])
def retrain(
    hardware: str = DEFAULT_HARDWARE,
    store: str = "data",
    work: str = ".specops/work",
    eval_workloads: list[str] | None = None,
    eval_prompts_per_workload: int = 8,
    max_new_tokens: int = 96,
    budgets: dict[str, float] | None = None,
    run_slot: str | None = None,
) -> Retrained:
    """``budgets`` overrides ``configs/retrain.yaml``'s time budgets (seconds per family);
    ``run_slot`` names the work folder (default: this run's scheduled start)."""
    logger = get_run_logger()
    _check_run_count()
    target = hardware_target(hardware)
    run_slot = run_slot or slot()
    store_root, dataset = Path(store), Path(work) / "dataset"
    out = Path(work) / "challengers" / hardware / run_slot
    summary = data_tasks.validate(store_root, dataset, hardware=target).summary
    tags = registry_tasks.lineage(store_root)
    challengers: list[DraftRef] = []
    package = training_tasks.train_suffix(store_root, dataset, out, hardware=target)
    challengers.append(
        registry_tasks.register(
            package,
            "suffix",
            params={"records": summary.validation.valid},
            tags=tags,
            key=f"{hardware}/{run_slot}/suffix",
        )
    )
    trained = training_tasks.train_learned(
        dataset, out, hardware=target, budgets=budgets, store=store_root
    )
    for result in trained:
        if result.skipped or result.package is None:
            logger.warning("%s challenger skipped: %s", result.family, result.skipped)
            continue
        logger.info("%s", result.summary)
        challengers.append(
            registry_tasks.register(
                result.package,
                result.family,
                params=result.params,
                tags=tags,
                curves=result.curves,
                key=f"{hardware}/{run_slot}/{result.family}",
            )
        )
    registry_tasks.record_retrain(
        target,
        run_slot,
        {"challengers": [c.label for c in challengers if c.label is not None], **tags},
    )
    decision = evaluate_and_promote(
        challengers,
        hardware=hardware,
        workloads=eval_workloads,
        prompts_per_workload=eval_prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=f"{work}/packages",
        traffic=f"{work}/dataset",
        store=store,
        lineage=tags,
    )
    # The acceptance predictor, judged on the champion draft this run leaves serving.
    predictor = evaluation_tasks.retrain_predictor(
        dataset,
        out,
        hardware=target,
        workloads=eval_workloads or ["humaneval"],
        prompts_per_workload=eval_prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=Path(work) / "packages",
        tags=tags,
        key=f"{hardware}/{run_slot}/predictor",
    )
    if predictor.skipped:
        logger.warning("predictor: %s", predictor.skipped)
    else:
        reason = None if predictor.gate is None else predictor.gate.reason
        logger.info("predictor %s: %s", predictor.challenger, reason)
    return Retrained(
        validation=summary,
        slot=run_slot,
        challengers=challengers,
        trained=trained,
        decision=decision,
        predictor=predictor,
    )


def _retrain_through(
    deployment: str, parameters: dict[str, Any], *, wait_s: float
) -> DeploymentRun:
    """A run of the retrain deployment for this slot (one per slot: a re-run of this
    collect gets the same run back), as this flow's subflow."""
    from typing import cast

    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    key = f"{deployment}:{parameters['hardware']}:{parameters['run_slot']}"
    # Called from a sync flow, run_deployment runs synchronously (it returns a coroutine
    # only when awaited from async code).
    run = cast(
        FlowRun,
        run_deployment(
            deployment,
            parameters=parameters,
            idempotency_key=key,
            timeout=wait_s,
            as_subflow=True,
            tags=["specops", "triggered"],
        ),
    )
    state = run.state.name if run.state is not None else "unknown"
    if (
        wait_s > 0
        and run.state is not None
        and run.state.is_final()
        and not run.state.is_completed()
    ):
        raise RuntimeError(f"retrain flow run {run.name} ({run.id}) ended {state}")
    return DeploymentRun(deployment=deployment, flow_run=str(run.id), name=run.name, state=state)


@flow(name="collect", timeout_seconds=TIMEOUTS_S["collect"])
def collect(
    hardware: str = DEFAULT_HARDWARE,
    store: str = "data",
    work: str = ".specops/work",
    replay_workload: str | None = None,
    replay_prompts: int = 0,
    run_id: str | None = None,
    max_new_tokens: int = 96,
    version: bool = True,
    trigger_retrain: bool = True,
    window: int = 50,
    threshold: float = 0.5,
    retrain_options: dict[str, Any] | None = None,
    cooldown_minutes: float | None = None,
    retrain_deployment: str | None = None,
    retrain_wait_s: float = 0.0,
    force_retrain: bool = False,
    retention_days: float | None = None,
) -> Collected:
    """``threshold`` is the absolute one, for a champion never evaluated; otherwise
    ``configs/retrain.yaml``'s relative threshold decides. ``retrain_options`` go to
    :func:`retrain`; ``cooldown_minutes`` overrides the config's cool-down.

    ``retrain_deployment`` (default ``SPECOPS_RETRAIN_DEPLOYMENT``; ``prefect.yaml`` sets
    ``retrain/daily``) starts the retrain as a run of that deployment, on its work pool,
    keyed by this run's slot: a re-run of this collect finds the retrain it started
    instead of starting another. ``retrain_wait_s`` waits that long for it to finish (0:
    start it and return). Without a deployment, the retrain runs here, in-process.
    ``force_retrain`` retrains whatever acceptance says (an operator's manual run:
    ``prefect deployment run collect/hourly -p force_retrain=true``).

    ``retention_days`` overrides ``configs/store.yaml``'s ``retention.days``: the store's
    parts older than that (by their newest row, at the scheduled start) are removed with
    the dataset's copies of them, before validation and versioning."""
    logger = get_run_logger()
    _check_run_count()
    target = hardware_target(hardware)
    store_root, dataset = Path(store), Path(work) / "dataset"
    replayed = None
    if replay_workload and replay_prompts > 0:
        replayed = data_tasks.replay_traffic(
            replay_workload,
            replay_prompts,
            hardware=target,
            store=store_root,
            # The schedule slot: a re-run of a killed run skips what it already wrote.
            run_id=run_id or slot("%Y-%m-%dT%H"),
            max_new_tokens=max_new_tokens,
        )
    retention = data_tasks.retention(
        store_root, dataset, days=retention_days, now=scheduled_timestamp()
    )
    _log_retention(retention)
    # The store is read here, once: the steps after it judge the champion on this view.
    validated = data_tasks.validate(
        store_root, dataset, hardware=target, window=window, threshold=threshold
    )
    data_version = data_tasks.version(store_root) if version else None
    # The watched champion first: a collapse is rolled back before any retrain, whose gates
    # then compare against the restored champion.
    watch = champion_tasks.watch_champion(validated.view)
    _log_watch(watch)
    shadow = champion_tasks.shadow_scores(validated.view, Path(work) / "packages")
    _log_shadow(shadow)
    trigger = champion_tasks.retrain_trigger(
        validated.view,
        absolute=threshold,
        now=scheduled_timestamp(),
        window=window,
        cooldown_minutes=cooldown_minutes,
    )
    for line in trigger.reasons:
        logger.info("%s", line)
    retrained: Retrained | DeploymentRun | None = None
    if force_retrain or (trigger.retrain and trigger_retrain):
        logger.info(
            "retrain forced" if force_retrain else "acceptance fell below its threshold: retraining"
        )
        retrained = _start_retrain(
            hardware,
            store,
            work,
            {"run_slot": slot(), **(retrain_options or {})},
            deployment=retrain_deployment or loop_settings().retrain_deployment,
            wait_s=retrain_wait_s,
        )
    elif trigger.held_back:
        logger.info("retrain wanted but held back: %s", trigger.held_back)
    return Collected(
        replayed=replayed,
        retention=retention,
        validation=validated.summary,
        data_version=data_version,
        trigger=trigger,
        retrained=retrained,
        watch=watch,
        shadow=shadow,
    )


def _start_retrain(
    hardware: str,
    store: str,
    work: str,
    options: dict[str, Any],
    *,
    deployment: str | None,
    wait_s: float,
) -> Retrained | DeploymentRun:
    """``retrain`` with ``options``: through its deployment when there is one
    (:func:`_retrain_through`), else here, in-process."""
    if not deployment:
        return retrain(hardware=hardware, store=store, work=work, **options)
    parameters = {"hardware": hardware, "store": store, "work": work, **options}
    handed = _retrain_through(deployment, parameters, wait_s=wait_s)
    get_run_logger().info("retrain: flow run %s (%s)", handed.flow_run, handed.state)
    return handed


def _log_retention(retention: RetentionReport) -> None:
    if retention.removed:
        get_run_logger().info(
            "retention: removed %d parts older than %s (%s)",
            len(retention.removed),
            retention.cutoff_utc,
            ", ".join(f"{area} {n}" for area, n in retention.parts.items()),
        )


def _log_watch(watch: Watch) -> None:
    logger = get_run_logger()
    for line in watch.reasons:
        logger.info("watch: %s", line)
    if watch.rolled_back_to:
        logger.warning(
            "watch: %s collapsed; rolled back to %s", watch.champion, watch.rolled_back_to
        )
    if watch.alarm:
        logger.error("watch: ALARM: %s", watch.alarm)


def _log_shadow(shadow: Shadow) -> None:
    logger = get_run_logger()
    for score in shadow.scores:
        logger.info(
            "shadow: %s (%s) on %s: acceptance %s, modelled speedup %s over %d records",
            score.label,
            score.role,
            score.workload,
            _shown(score.acceptance_rate),
            _shown(score.modelled_speedup),
            score.records,
        )


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
