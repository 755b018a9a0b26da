"""The main job: the loop on a drift scenario, end to end, on embedded defaults.

1. bootstrap: prompt lookup (an n-gram draft) is evaluated on the first traffic's held-out
   prompts and promoted as the first champion of the hardware target;
2. drift: grounded edit/summarise traffic (where prompt lookup shines) is served and
   collected, then HumanEval traffic, where it accepts far less; the rolling acceptance
   drops below the threshold and the collect flow triggers the retrain flow;
3. retrain: a suffix-decoding draft is rebuilt from the target's collected outputs,
   registered, evaluated against the champion on held-out HumanEval prompts, gated and
   promoted if it is faster;
4. report: before/after figures, a plot, and where to look (MLflow, Prefect).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.loop import bootstrap, collect
from tasks.loop import prefect_tasks as steps


@flow(name="drift-demo")
def drift_demo(
    hardware: str = "cpu",
    work: str = ".specops/demo",
    before_workload: str = "grounded",
    after_workload: str = "humaneval",
    before_prompts: int = 12,
    after_prompts: int = 32,
    eval_prompts: int = 8,
    max_new_tokens: int = 96,
) -> dict[str, Any]:
    logger = get_run_logger()
    store = f"{work}/store"
    bootstrapped = bootstrap(
        hardware=hardware,
        workloads=[before_workload],
        prompts_per_workload=4,
        max_new_tokens=max_new_tokens,
        work=work,
    )["bootstrapped"]
    logger.info("champion before drift: %s", steps.champion(hardware))
    phases = []
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
            )
        )
    retrained = phases[-1]["retrained"]
    if retrained is None:
        logger.warning("rolling acceptance did not fall below the threshold: no retrain")
    return {"bootstrap": bootstrapped, "phases": phases, "retrained": retrained}
