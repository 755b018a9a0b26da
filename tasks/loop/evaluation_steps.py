"""The loop's evaluation and promotion steps as plain typed functions: evaluate the
challengers against the champion on held-out prompts of a hardware target, gate them,
promote the fastest that passes (:func:`evaluate_and_decide`, :func:`decide`); the same
for the acceptance predictor. Prefect wraps each in :mod:`tasks.loop.evaluation_tasks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from registry.client import DraftVersion, Registry
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from tasks.data import traffic
from tasks.data.dataset import read_part
from tasks.data.prompts import Prompt
from tasks.evaluate import gates as gate_config
from tasks.evaluate.evaluate import Contender, EncodedPrompt, evaluate_report, traffic_prompts
from tasks.evaluate.gates import Check, GateResult, gate, judged_report
from tasks.evaluate.report import EvaluationReport
from tasks.loop import targets
from tasks.loop.predictor_step import PredictorOutcome
from tasks.loop.results import Decision, DraftRef
from tasks.settings import promotion_limit

# How long evaluate-gate-promote waits for its target's promotion slot (another flow holds
# it while it evaluates and promotes on that target).
PROMOTION_WAIT_S = 3 * 3600


# What an evaluation records per contender (overall, and per workload with a prefix).
METRIC_KEYS = ("acceptance_rate", "mean_accepted_length", "tokens_per_s", "speedup")


def evaluation_metrics(
    report: EvaluationReport, name: str, judged: EvaluationReport | None = None
) -> dict[str, float]:
    """``name``'s metrics in ``report`` as the registry keeps them: overall, and per
    workload as ``<workload>/<metric>`` (the relative retrain trigger reads those).
    ``speedup`` is the measured one; with the report the gates judged (``judged``, when
    it prices speed) its speedup beside it as ``judged_speedup``, and the drafting cost
    the evaluation profiled as ``draft_cost``."""
    result = report.results[name]
    metrics = {k: float(v) for k in METRIC_KEYS if (v := getattr(result, k)) is not None}
    metrics["lossless"] = float(result.lossless)
    value = None if judged is None or judged is report else judged.results[name].speedup
    if value is not None:
        metrics["judged_speedup"] = float(value)
    if name in report.draft_costs:
        metrics["draft_cost"] = float(report.draft_costs[name])
    for workload, by_name in report.by_workload.items():
        row = by_name.get(name)
        if row is None:
            continue
        for key in ("acceptance_rate", "mean_accepted_length", "speedup"):
            if (value := getattr(row, key)) is not None:
                metrics[f"{workload}/{key}"] = float(value)
    return metrics


def evaluate_and_decide(
    registry: Registry,
    challengers: Sequence[DraftVersion],
    prompts: Sequence[Prompt | EncodedPrompt],
    *,
    hardware: HardwareTarget,
    cache: Path,
    max_new_tokens: int,
    promote: bool = True,
    progress: bool = True,
    tags: dict[str, str] | None = None,
    pregate: bool = True,
) -> Decision:
    """Evaluate the champion and every challenger in one interleaved run on ``hardware``,
    then :func:`decide` (``tags``, the lineage, go on every evaluation run). ``pregate``
    False times every challenger, however slow the pre-gate predicts it (an operator's
    evaluation of a version before promoting it by hand)."""
    target = targets.target_for(hardware)
    current = registry.champion(hardware.name)
    contenders: list[Contender] = []
    by_name: dict[str, DraftVersion] = {}
    if current is not None:
        contenders.append(Contender("champion", registry.download(current, cache)))
        by_name["champion"] = current
    for index, draft in enumerate(challengers):
        registry.set_challenger(draft, hardware.name)
        name = f"challenger-{index}"
        contenders.append(Contender(name, registry.download(draft, cache)))
        by_name[name] = draft
    gates_now = gate_config.load_gates()
    report = evaluate_report(
        contenders,
        prompts,
        target=target,
        max_new_tokens=max_new_tokens,
        rounds=gates_now.wall_clock_rounds,
        stop_confidence=gates_now.wall_clock_confidence,
        pregate_margin=gates_now.pregate_margin if pregate else None,
        progress=progress,
    )
    return decide(
        registry, report, by_name, hardware=hardware, cache=cache, promote=promote, tags=tags
    )


def decide(
    registry: Registry,
    report: EvaluationReport,
    by_name: dict[str, DraftVersion],
    *,
    hardware: HardwareTarget,
    cache: Path,
    promote: bool = True,
    params: Mapping[str, object] | None = None,
    artifacts: Sequence[Path] = (),
    tags: dict[str, str] | None = None,
) -> Decision:
    """Log each contender's evaluation to MLflow (with ``params`` and ``artifacts``, e.g.
    where it ran and the evaluation file), gate every challenger against the
    contender named ``champion`` (the champion when the evaluation ran), and promote the
    fastest that passes, unless the champion moved since (then nothing is promoted: the
    registry refuses, and the challengers need a new evaluation against the new champion).
    The evaluation may have run here or on another machine (``specops registry
    log-evaluation``)."""
    hardware_name = hardware.name  # the registry's key and the decision's
    current = by_name.get("champion")
    config = gate_config.load_gates()
    unjudged: str | None = None
    try:
        judged = judged_report(report, config)
    except BadInputError as error:  # e.g. an older evaluation file: no drafting costs
        judged, unjudged = report, str(error)
    kept = {"contender": None, **report.model_dump(mode="json", exclude={"per_prompt"})}
    gates: dict[str, GateResult] = {}
    for name, draft in by_name.items():
        if name in report.untimed:  # the pre-gate refused it: nothing was timed to log
            reason = report.untimed[name]
            registry.tag_version(draft, f"pregate.{hardware_name}", reason)
            check = Check(name="pre-gate", passed=False, detail=reason)
            gates[name] = GateResult.of([check], config.decided_by)
            continue
        registry.log_evaluation(
            draft,
            hardware_name,
            evaluation_metrics(report, name, judged),
            report={**kept, "contender": name},
            params=None if params is None else dict(params),
            artifacts=list(artifacts),
            tags=tags,
        )
        if name == "champion":
            continue
        if unjudged is not None:
            refused = Check(name=config.decided_by, passed=False, detail=unjudged)
            gates[name] = GateResult.of([refused], config.decided_by)
        else:
            gates[name] = gate(judged, challenger=name, champion="champion", config=config)
    passing = [n for n, g in gates.items() if g.passed]
    promoted = None
    exports: dict[str, str] = {}
    if passing and promote:
        best = max(passing, key=lambda n: judged.results[n].speedup or 0.0)
        winner = registry.get(by_name[best].family, by_name[best].version)
        chosen = judged.results[best]
        measured = report.results[best].speedup
        registry.promote(
            winner,
            hardware_name,
            reason=gates[best].reason,
            metrics={
                **{
                    k: float(v)
                    for k in ("acceptance_rate", "mean_accepted_length", "speedup")
                    if (v := getattr(chosen, k)) is not None
                },
                **({} if measured is None else {"measured_speedup": float(measured)}),
            },
            gates=gates[best].model_dump(mode="json"),
            expected_champion=current.label if current else None,
        )
        promoted = winner.label
        from tasks.loop.target_promotion import export_for_targets

        exports = export_for_targets(registry, winner, cache)
    return Decision(
        hardware=hardware_name,
        labels={name: draft.label for name, draft in by_name.items()},
        champion=current.label if current else None,
        promoted=promoted,
        exports=exports,
        gates={by_name[n].label: g for n, g in gates.items()},
        results=report.results,
        by_workload=report.by_workload,
        by_source=report.by_source,
        phase_s=dict(report.phase_s),
        predicted={
            by_name[n].label: v for n, v in report.predicted_speedups.items() if n in by_name
        },
    )


def heldout_prompts(
    workloads: Sequence[str],
    per_workload: int,
    *,
    seed: int = 0,
    dataset_dir: Path | None = None,
    traffic_per_workload: int = 8,
) -> list[Prompt | EncodedPrompt]:
    """The evaluation prompts: each built-in workload's held-out prompts and, with a
    ``dataset_dir``, its held-out traffic (``heldout_traffic.jsonl``, never trained on)."""
    prompts: list[Prompt | EncodedPrompt] = [
        p
        for workload in workloads
        for p in traffic.build_workload(workload, per_workload, seed=seed, split="heldout")
    ]
    if dataset_dir is not None:
        held = read_part(dataset_dir, "heldout_traffic")
        prompts += traffic_prompts(held, per_workload=traffic_per_workload)
    return prompts


def evaluate_gate_promote(
    registry: Registry,
    challengers: Sequence[DraftRef],
    *,
    hardware: HardwareTarget,
    workloads: Sequence[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: Path,
    promote: bool = True,
    seed: int = 0,
    traffic_dir: Path | None = None,
    traffic_per_workload: int = 8,
    lineage: dict[str, str] | None = None,
    pregate: bool = True,
) -> Decision:
    """Evaluate on ``workloads``' held-out prompts and, with ``traffic_dir`` (a dataset
    folder), on its held-out traffic (``heldout_traffic.jsonl``): the newest collected
    requests, never trained on; then :func:`evaluate_and_decide` (``lineage``, the data
    version and git commit, tags every evaluation run; ``pregate`` False times every
    challenger), holding ``hardware``'s promotion slot."""
    from prefect.concurrency.sync import concurrency

    drafts = [registry.get(c.family, c.version) for c in challengers]
    prompts = heldout_prompts(
        workloads,
        prompts_per_workload,
        seed=seed,
        dataset_dir=traffic_dir,
        traffic_per_workload=traffic_per_workload,
    )
    # One evaluate-and-promote per target at a time, across every machine: the second
    # evaluates against the champion the first left (tasks/ops/prefect_setup.py creates
    # the limit; without it, e.g. on the embedded server, only the registry's lock and its
    # compare-and-swap guard the promotion).
    with concurrency(
        promotion_limit(hardware.name), occupy=1, timeout_seconds=PROMOTION_WAIT_S, strict=False
    ):
        return evaluate_and_decide(
            registry,
            drafts,
            prompts,
            hardware=targets.engine_of(hardware),
            cache=cache,
            max_new_tokens=max_new_tokens,
            promote=promote,
            tags=lineage,
            pregate=pregate,
        )


def retrain_predictor(
    registry: Registry,
    dataset_dir: Path,
    out_dir: Path,
    *,
    hardware: HardwareTarget,
    workloads: Sequence[str],
    prompts_per_workload: int,
    max_new_tokens: int,
    cache: Path,
    tags: dict[str, str] | None = None,
    promote: bool = True,
    seed: int = 0,
    traffic_per_workload: int = 8,
    key: str | None = None,
) -> PredictorOutcome:
    """Train the acceptance predictor on ``dataset_dir``, register it, and promote it if it
    makes the champion draft faster than the current policy (interleaved, same prompts as
    the drafts' evaluation: built-in held-out and the dataset's held-out traffic;
    :func:`tasks.loop.predictor_step.retrain_predictor`)."""
    from tasks.loop import predictor_step

    prompts = heldout_prompts(
        workloads,
        prompts_per_workload,
        seed=seed,
        dataset_dir=dataset_dir,
        traffic_per_workload=traffic_per_workload,
    )
    return predictor_step.retrain_predictor(
        registry,
        dataset_dir,
        out_dir,
        prompts,
        hardware=hardware,
        cache=cache,
        max_new_tokens=max_new_tokens,
        tags=tags,
        promote=promote,
        key=key,
    )
