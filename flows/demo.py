"""The main job: the loop on a drift scenario, end to end, on embedded defaults.

1. bootstrap: prompt lookup (an n-gram draft) is evaluated on the first traffic's held-out
   prompts, beside the shipped base head where the target has one (configs/retrain.yaml
   ``base_head``), and the faster passing one promoted as the first champion;
2. before the drift: grounded edit/summarise traffic (where prompt lookup shines) is served
   and collected, and the scheduled (daily) retrain runs on it: the first suffix challenger
   and the head continued from the base head (and a LoRA draft where the target's
   retrain lists one); prompt lookup usually stays champion, and the head becomes the one
   the next retrain continues from;
3. drift: HumanEval traffic, where prompt lookup accepts far less; the rolling acceptance
   falls below its threshold relative to the champion's evaluation, and the collect flow
   triggers the retrain flow;
4. retrain: the suffix draft is rebuilt and the head continued on the failure/replay mix;
   each is registered, evaluated against the champion on the held-out slice of the
   drifted traffic and on the built-in workloads, gated, and the fastest passing one
   promoted;
5. drill: the last retrain's head (a draft with weights) is evaluated and promoted by
   hand, then its weights are scrambled on the serving machine's disk (it still loads,
   and proposes wrong tokens); the next ``collect`` serves traffic with it, and its watch
   (:mod:`tasks.loop.watch`) finds live acceptance collapsed against the evaluated one and
   restores the champion the head displaced, holding the head out of promotion;
6. report: before/after figures, a plot, and where to look (MLflow, Prefect).

The demo compresses hours of traffic into minutes, so it turns the retrain cool-down off
and keeps the training budgets small (``budgets``; ``configs/retrain.yaml`` has the
production ones).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.loop import bootstrap, collect, evaluate_and_promote, retrain
from serving.hardware import DEFAULT_HARDWARE, hardware_target
from tasks.loop import registry_tasks
from tasks.loop.results import Collected, DemoResult, DraftRef, Drill, Retrained

# The drill's draft: a family whose package carries weights to damage.
DRILL_FAMILY = "head"


@flow(name="drift-demo")
def drift_demo(
    hardware: str = DEFAULT_HARDWARE,
    work: str = ".specops/demo",
    before_workload: str = "grounded",
    after_workload: str = "humaneval",
    before_prompts: int = 16,
    after_prompts: int = 24,
    eval_prompts: int = 4,
    max_new_tokens: int = 64,
    budgets: dict[str, float] | None = None,
    drill: bool = True,
) -> DemoResult:
    logger = get_run_logger()
    target = hardware_target(hardware)
    store = f"{work}/store"
    bootstrapped = bootstrap(
        hardware=hardware,
        workloads=[before_workload],
        prompts_per_workload=4,
        max_new_tokens=max_new_tokens,
        work=work,
    ).bootstrapped
    logger.info("champion before drift: %s", registry_tasks.champion(target))
    budgets = budgets if budgets is not None else {"head": 30.0, "lora": 30.0}
    retrain_options: dict[str, Any] = {
        "eval_workloads": [before_workload, after_workload],
        "eval_prompts_per_workload": eval_prompts,
        "max_new_tokens": max_new_tokens,
        "budgets": budgets,
    }
    phases: list[Collected] = []
    scheduled: Retrained | None = None
    for index, (workload, n) in enumerate(
        [(before_workload, before_prompts), (after_workload, after_prompts)], start=1
    ):
        phases.append(
            collect(
                hardware=hardware,
                store=store,
                work=work,
                replay_workload=workload,
                replay_prompts=n,
                run_id=f"demo-phase-{index}",
                max_new_tokens=max_new_tokens,
                version=False,  # the demo's store lives outside DVC; see `specops data version`
                trigger_retrain=index == 2,
                retrain_options={**retrain_options, "run_slot": f"demo-phase-{index}"},
                cooldown_minutes=0.0,
            )
        )
        if index == 1:  # the daily retrain, scheduled whatever the acceptance
            scheduled = retrain(
                hardware=hardware, store=store, work=work, run_slot="demo-daily", **retrain_options
            )
            logger.info("daily retrain: champion %s", registry_tasks.champion(target))
    retrained = phases[-1].retrained
    if retrained is None:
        # The champion accepts what its evaluation predicted: no drift alarm. The daily
        # retrain still runs at its hour, on the traffic collected since.
        logger.info("no retrain triggered: the scheduled one runs on the drifted traffic")
        retrained = retrain(
            hardware=hardware, store=store, work=work, run_slot="demo-daily-2", **retrain_options
        ).model_copy(update={"scheduled": True})
    if not isinstance(retrained, Retrained):
        raise RuntimeError(
            f"the retrain went to deployment {retrained.deployment}; the main job runs its "
            "retrains in this process: unset SPECOPS_RETRAIN_DEPLOYMENT"
        )
    drilled = None
    if drill:
        drilled = _drill(
            retrained,
            hardware=hardware,
            store=store,
            work=work,
            workload=after_workload,
            eval_prompts=eval_prompts,
            max_new_tokens=max_new_tokens // 2,
        )
    return DemoResult(
        bootstrap=bootstrapped,
        phases=phases,
        daily_retrain=scheduled,
        retrained=retrained,
        drill=drilled,
    )


def _drill(
    retrained: Retrained,
    *,
    hardware: str,
    store: str,
    work: str,
    workload: str,
    eval_prompts: int,
    max_new_tokens: int,
) -> Drill:
    """The drill on the weighted draft ``retrained`` registered; skipped (and said so)
    when it registered none."""
    weighted = [c for c in retrained.challengers if c.family == DRILL_FAMILY]
    if not weighted:
        reason = f"the last retrain registered no {DRILL_FAMILY} draft (no weights to damage)"
        get_run_logger().warning("drill skipped: %s", reason)
        return Drill(skipped=reason)
    return damaged_champion_drill(
        hardware=hardware,
        store=store,
        work=work,
        draft=DraftRef(family=weighted[0].family, version=weighted[0].version),
        workload=workload,
        eval_prompts=eval_prompts,
        max_new_tokens=max_new_tokens,
    )


@flow(name="drill-damaged-champion")
def damaged_champion_drill(
    hardware: str,
    store: str,
    work: str,
    draft: DraftRef,
    workload: str = "humaneval",
    eval_prompts: int = 4,
    max_new_tokens: int = 48,
) -> Drill:
    """Evaluate ``draft`` (a draft with weights) on ``workload`` and promote it by hand,
    scramble its weights where serving loads them, and collect: the watch must roll it
    back to the champion it displaced."""
    from tasks.loop.retrain_config import load_retrain_config

    logger = get_run_logger()
    # Run again after its hand promotion (an interrupted drill), the draft serves already:
    # what it displaced is the champion before it, and its evaluation before the promotion
    # stands (evaluating it again could time a copy already damaged and make that the
    # yardstick the watch holds it to).
    target = hardware_target(hardware)
    displaced, serving = registry_tasks.displaced_by(draft, hardware=target)
    evaluated = None
    if serving:
        label = registry_tasks.champion(target)
        logger.warning(
            "drill: %s serves already (this drill ran before); it is not evaluated "
            "or promoted again",
            label,
        )
    else:
        # Promotion by hand needs an evaluation on the target: every contender timed, the
        # pre-gate's prediction aside (it refused the head in the retrain).
        evaluated = evaluate_and_promote(
            [draft],
            hardware=hardware,
            workloads=[workload],
            prompts_per_workload=eval_prompts,
            max_new_tokens=max_new_tokens,
            cache=f"{work}/packages",
            promote=False,
            store=store,
            pregate=False,
        )
        label = registry_tasks.promote_by_hand(
            draft, hardware=target, reason="main job drill: promoted by hand, to be damaged"
        )
    scrambled = registry_tasks.scramble_champion(target)
    logger.warning(
        "drill: %s promoted, then its weights scrambled on disk: %s", label, ", ".join(scrambled)
    )
    collected = collect(
        hardware=hardware,
        store=store,
        work=work,
        replay_workload=workload,
        replay_prompts=load_retrain_config().watch.newest,
        run_id="demo-drill",
        max_new_tokens=max_new_tokens,
        version=False,
        trigger_retrain=False,
        cooldown_minutes=0.0,
    )
    result = Drill(
        draft=label,
        displaced=displaced,
        evaluated=evaluated,
        scrambled=scrambled,
        collected=collected,
    )
    if result.restored:
        logger.info("drill: the watch rolled %s back to %s", label, displaced)
    else:
        logger.error("drill: the watch did not restore %s over the damaged %s", displaced, label)
    return result
