"""The loop's flows. They only wire tasks (``tasks/loop/prefect_tasks.py``).

- ``collect``: (optionally replay a workload through the champion,) validate the store,
  version it with DVC, and trigger ``retrain`` when rolling acceptance falls below a
  threshold relative to the champion's evaluated acceptance, outside the cool-down
  (:mod:`tasks.loop.triggers`). Scheduled hourly.
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

from typing import Any

from prefect import flow, get_run_logger

from tasks.loop import prefect_tasks as steps


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


@flow(name="evaluate-and-promote")
def evaluate_and_promote(
    challengers: list[dict[str, str]],
    hardware: str = "cpu",
    workloads: list[str] | None = None,
    prompts_per_workload: int = 8,
    max_new_tokens: int = 96,
    cache: str = ".specops/work/packages",
    promote: bool = True,
    traffic: str | None = None,
    traffic_per_workload: int = 8,
) -> dict[str, Any]:
    decision = steps.evaluate_gate_promote(
        challengers,
        hardware=hardware,
        workloads=workloads or ["humaneval"],
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=cache,
        promote=promote,
        traffic=traffic,
        traffic_per_workload=traffic_per_workload,
    )
    logger = get_run_logger()
    for label, result in decision["gates"].items():
        logger.info("%s: %s", label, result["reason"])
    logger.info(
        "champion on %s: %s", hardware, decision["promoted"] or f"kept {decision['champion']}"
    )
    return decision


@flow(name="bootstrap")
def bootstrap(
    hardware: str = "cpu",
    drafter: str = "pld:3",
    family: str = "ngram",
    k: int = 10,
    policy: str = "cost",
    workloads: list[str] | None = None,
    prompts_per_workload: int = 4,
    max_new_tokens: int = 96,
    work: str = ".specops/work",
) -> dict[str, Any]:
    logger = get_run_logger()
    current = steps.champion(hardware)
    if current is not None:
        logger.info("%s already has a champion (%s): nothing to bootstrap", hardware, current)
        return {"champion": current, "bootstrapped": None}
    package = steps.builtin_package(drafter, f"{work}/bootstrap", k=k, policy=policy, family=family)
    draft = steps.register(package, family)
    decision = evaluate_and_promote(
        [draft],
        hardware=hardware,
        workloads=workloads or ["grounded"],
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=f"{work}/packages",
    )
    return {"champion": decision["promoted"], "bootstrapped": decision}


@flow(name="retrain")
def retrain(
    hardware: str = "cpu",
    store: str = "data",
    work: str = ".specops/work",
    eval_workloads: list[str] | None = None,
    eval_prompts_per_workload: int = 8,
    max_new_tokens: int = 96,
    budgets: dict[str, float] | None = None,
    run_slot: str | None = None,
) -> dict[str, Any]:
    """``budgets`` overrides ``configs/retrain.yaml``'s time budgets (seconds per family);
    ``run_slot`` names the work folder (default: this run's scheduled start)."""
    logger = get_run_logger()
    run_slot = run_slot or slot()
    dataset = f"{work}/dataset"
    out = f"{work}/challengers/{hardware}/{run_slot}"
    summary = steps.validate(store, dataset)
    tags = steps.lineage(store)
    challengers = []
    package = steps.train_suffix(store, dataset, out, hardware=hardware)
    challengers.append(
        steps.register(
            package, "suffix", params={"records": summary["validation"]["valid"]}, tags=tags
        )
    )
    trained = steps.train_learned(dataset, out, hardware=hardware, budgets=budgets)
    for result in trained:
        if result["skipped"]:
            logger.warning("%s challenger skipped: %s", result["family"], result["skipped"])
            continue
        logger.info("%s", result["summary"])
        challengers.append(
            steps.register(
                result["package"],
                result["family"],
                params=result["params"],
                tags=tags,
                curves=result["curves"],
            )
        )
    steps.record_retrain(
        hardware, run_slot, {"challengers": [c["label"] for c in challengers], **tags}
    )
    decision = evaluate_and_promote(
        challengers,
        hardware=hardware,
        workloads=eval_workloads,
        prompts_per_workload=eval_prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=f"{work}/packages",
        traffic=dataset,
    )
    # The acceptance predictor, judged on the champion draft this run leaves serving.
    predictor = steps.retrain_predictor(
        dataset,
        out,
        hardware=hardware,
        workloads=eval_workloads or ["humaneval"],
        prompts_per_workload=eval_prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=f"{work}/packages",
        tags=tags,
    )
    if predictor["skipped"]:
        logger.warning("predictor: %s", predictor["skipped"])
    else:
        logger.info(
            "predictor %s: %s", predictor["challenger"], (predictor["gate"] or {}).get("reason")
        )
    return {
        "validation": summary,
        "slot": run_slot,
        "challengers": challengers,
        "trained": trained,
        "decision": decision,
        "predictor": predictor,
    }


@flow(name="collect")
def collect(
    hardware: str = "cpu",
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
) -> dict[str, Any]:
    """``threshold`` is the absolute one, for a champion never evaluated; otherwise
    ``configs/retrain.yaml``'s relative threshold decides. ``retrain_options`` go to
    :func:`retrain`; ``cooldown_minutes`` overrides the config's cool-down."""
    logger = get_run_logger()
    replayed = None
    if replay_workload and replay_prompts > 0:
        replayed = steps.replay_traffic(
            replay_workload,
            replay_prompts,
            hardware=hardware,
            store=store,
            # The schedule slot: a re-run of a killed run skips what it already wrote.
            run_id=run_id or slot("%Y-%m-%dT%H"),
            max_new_tokens=max_new_tokens,
        )
    summary = steps.validate(store, f"{work}/dataset", window=window, threshold=threshold)
    data_version = steps.version(store) if version else None
    trigger = steps.retrain_trigger(
        store,
        hardware=hardware,
        absolute=threshold,
        now=scheduled_timestamp(),
        window=window,
        cooldown_minutes=cooldown_minutes,
    )
    for line in trigger["reasons"]:
        logger.info("%s", line)
    retrained = None
    if trigger["retrain"] and trigger_retrain:
        logger.info("acceptance fell below its threshold: retraining")
        options = {"run_slot": slot(), **(retrain_options or {})}
        retrained = retrain(hardware=hardware, store=store, work=work, **options)
    elif trigger["held_back"]:
        logger.info("retrain wanted but held back: %s", trigger["held_back"])
    return {
        "replayed": replayed,
        "validation": summary,
        "data_version": data_version,
        "trigger": trigger,
        "retrained": retrained,
    }
