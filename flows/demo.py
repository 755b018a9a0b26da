"""The main job: the loop on a drift scenario, end to end, on embedded defaults.

1. bootstrap: prompt lookup (an n-gram draft) is evaluated on the first traffic's held-out
   prompts and promoted as the first champion of the hardware target;
2. before the drift: grounded edit/summarise traffic (where prompt lookup shines) is served
   and collected, and the scheduled (daily) retrain runs on it: the first suffix, head and
   LoRA challengers; prompt lookup usually stays champion, and the head becomes the one
   the next retrain continues from;
3. drift: HumanEval traffic, where prompt lookup accepts far less; the rolling acceptance
   falls below its threshold relative to the champion's evaluation, and the collect flow
   triggers the retrain flow;
4. retrain: the suffix draft is rebuilt, the head continued and a LoRA draft trained on the
   failure/replay mix; each is registered, evaluated against the champion on the held-out
   slice of the drifted traffic and on the built-in workloads, gated, and the fastest
   passing one promoted;
5. report: before/after figures, a plot, and where to look (MLflow, Prefect).

The demo compresses hours of traffic into minutes, so it turns the retrain cool-down off
and keeps the training budgets small (``budgets``; ``configs/retrain.yaml`` has the
production ones).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.loop import bootstrap, collect, retrain
from tasks.loop import prefect_tasks as steps
from tasks.loop.results import Collected, DemoResult, Retrained


@flow(name="drift-demo")
def drift_demo(
    hardware: str = "cpu",
    work: str = ".specops/demo",
    before_workload: str = "grounded",
    after_workload: str = "humaneval",
    before_prompts: int = 24,
    after_prompts: int = 32,
    eval_prompts: int = 4,
    max_new_tokens: int = 96,
    budgets: dict[str, float] | None = None,
) -> DemoResult:
    logger = get_run_logger()
    store = f"{work}/store"
    bootstrapped = bootstrap(
        hardware=hardware,
        workloads=[before_workload],
        prompts_per_workload=4,
        max_new_tokens=max_new_tokens,
        work=work,
    ).bootstrapped
    logger.info("champion before drift: %s", steps.champion(hardware))
    budgets = budgets if budgets is not None else {"head": 60.0, "lora": 60.0}
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
                hardware=hardware, store=store, work=work, run_slot="demo-daily",
                **retrain_options,
            )  # fmt: skip
            logger.info("daily retrain: champion %s", steps.champion(hardware))
    retrained = phases[-1].retrained
    if retrained is None:
        # The champion accepts what its evaluation predicted: no drift alarm. The daily
        # retrain still runs at its hour, on the traffic collected since.
        logger.info("no retrain triggered: the scheduled one runs on the drifted traffic")
        retrained = retrain(
            hardware=hardware, store=store, work=work, run_slot="demo-daily-2",
            **retrain_options,
        ).model_copy(update={"scheduled": True})  # fmt: skip
    if not isinstance(retrained, Retrained):
        raise RuntimeError(
            f"the retrain went to deployment {retrained.deployment}; the main job runs its "
            "retrains in this process: unset SPECOPS_RETRAIN_DEPLOYMENT"
        )
    return DemoResult(
        bootstrap=bootstrapped,
        phases=phases,
        daily_retrain=scheduled,
        retrained=retrained,
    )
