"""The loop's flows. They only wire tasks (``tasks/loop/prefect_tasks.py``).

- ``collect``: (optionally replay a workload through the champion,) validate the store,
  version it with DVC, and trigger ``retrain`` when rolling acceptance falls below the
  threshold. Scheduled hourly.
- ``retrain``: rebuild challengers from the collected traffic, register them, then
  ``evaluate-and-promote``. Scheduled daily, and triggered by ``collect``.
- ``evaluate-and-promote``: one interleaved evaluation of champion and challengers on
  held-out prompts of a hardware target; the gates decide; the fastest passing
  challenger becomes the champion (the registry alias moves; servers hot-swap to it).
- ``bootstrap``: a hardware target's first champion: a built-in drafter (prompt lookup by
  default) is registered and goes through ``evaluate-and-promote`` (with no champion, it
  must beat plain decoding). Run once per target, before ``collect``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from tasks.loop import prefect_tasks as steps


@flow(name="evaluate-and-promote")
def evaluate_and_promote(
    challengers: list[dict[str, str]],
    hardware: str = "cpu",
    workloads: list[str] | None = None,
    prompts_per_workload: int = 8,
    max_new_tokens: int = 96,
    cache: str = ".specops/work/packages",
    promote: bool = True,
) -> dict[str, Any]:
    decision = steps.evaluate_gate_promote(
        challengers,
        hardware=hardware,
        workloads=workloads or ["humaneval"],
        prompts_per_workload=prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=cache,
        promote=promote,
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
) -> dict[str, Any]:
    summary = steps.validate(store, f"{work}/dataset")
    package = steps.train_suffix(store, f"{work}/challengers", hardware=hardware)
    challenger = steps.register(
        package, "suffix", params={"records": summary["validation"]["valid"]}
    )
    decision = evaluate_and_promote(
        [challenger],
        hardware=hardware,
        workloads=eval_workloads,
        prompts_per_workload=eval_prompts_per_workload,
        max_new_tokens=max_new_tokens,
        cache=f"{work}/packages",
    )
    return {"validation": summary, "challenger": challenger, "decision": decision}


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
) -> dict[str, Any]:
    from datetime import UTC, datetime

    logger = get_run_logger()
    replayed = None
    if replay_workload and replay_prompts > 0:
        replayed = steps.replay_traffic(
            replay_workload,
            replay_prompts,
            hardware=hardware,
            store=store,
            # The hour is the schedule slot: a re-run of a killed run skips what it wrote.
            run_id=run_id or datetime.now(tz=UTC).strftime("%Y-%m-%dT%H"),
            max_new_tokens=max_new_tokens,
        )
    summary = steps.validate(store, f"{work}/dataset", window=window, threshold=threshold)
    data_version = steps.version(store) if version else None
    retrained = None
    if summary["retrain_wanted"] and trigger_retrain:
        logger.info("rolling acceptance below %.2f: retraining", threshold)
        retrained = retrain(hardware=hardware, store=store, work=work)
    return {
        "replayed": replayed,
        "validation": summary,
        "data_version": data_version,
        "retrained": retrained,
    }
