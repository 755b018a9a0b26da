"""The closed loop's steps as plain typed functions (Prefect wraps them in
``tasks/loop/prefect_tasks.py``; the flows in ``flows/`` only wire them).

collect (replayed or live traffic through the champion, detailed mode) -> validate and
build the dataset -> version (DVC) -> train challengers from the collected traffic ->
register them -> evaluate challengers against the champion on held-out prompts, per
hardware target -> gate -> promote the best passing challenger (or keep the champion).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from registry.client import DraftVersion, Registry
from serving.engine.build import build_decoder
from serving.engine.drafters.kinds import BUILTIN_KINDS
from serving.engine.drafters.package import DraftManifest, load_package, write_package
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY, DraftPlan
from serving.errors import BadInputError
from serving.hardware import HardwareTarget, engine_target
from serving.loader import load_target
from serving.records.schema import RequestRecord
from serving.target import LoadedTarget
from tasks.data.collect import CollectSummary, collect
from tasks.data.curate import CurateSummary, curate
from tasks.data.dataset import read_part
from tasks.data.prompts import Prompt
from tasks.data.retention import RetentionReport
from tasks.evaluate import gates as gate_config
from tasks.evaluate.evaluate import Contender, EncodedPrompt, evaluate_report
from tasks.evaluate.gates import Check, GateResult, gate, judged_report
from tasks.evaluate.report import EvaluationReport, Group
from tasks.settings import loop_settings

log = logging.getLogger(__name__)

# The targets this process loaded, by hardware target's name and source.
_LOADED: dict[tuple[str, str], LoadedTarget] = {}


def engine_of(hardware: HardwareTarget) -> HardwareTarget:
    """``hardware`` where the specops engine serves it, with its measured verify curve;
    else the :class:`BadInputError` :func:`serving.hardware.engine_target` gives for it."""
    if hardware.backend == "transformers" and hardware.verify_curve:
        return hardware
    engine_target(hardware.name)  # raises, saying which of the two it lacks
    raise BadInputError(f"hardware target {hardware.name!r} is not served by the specops engine")


def target_for(hardware: HardwareTarget, source: str | None = None) -> LoadedTarget:
    """The target model ``source`` (default: ``SPECOPS_TARGET``, :mod:`tasks.settings`)
    loaded for ``hardware``, once per process."""
    source = source or loop_settings().target
    key = (hardware.name, source)
    loaded = _LOADED.get(key)
    if loaded is None or loaded.hardware != hardware:
        loaded = _LOADED[key] = load_target(source, hardware)
    return loaded


def champion_package(registry: Registry, hardware: str, cache: Path) -> tuple[DraftVersion, Path]:
    draft = registry.champion(hardware)
    if draft is None:
        raise BadInputError(
            f"no champion on hardware target {hardware!r}: bootstrap one first with "
            f"`specops loop bootstrap --hardware {hardware}` (the main job does it too)"
        )
    return draft, registry.download(draft, cache)


def head_to_continue(registry: Registry, hardware: str, cache: Path) -> Path | None:
    """The head a retrain continues from: the head family's champion on ``hardware``, else
    its newest version evaluated there (a head trained before the drift, say, that lost to
    another family), else None (a fresh head)."""
    from registry.client import CHAMPION, alias
    from registry.history import newest_evaluated

    draft = registry.by_alias("head", alias(CHAMPION, hardware)) or newest_evaluated(
        registry, "head", hardware
    )
    if draft is None:
        return None
    return registry.download(draft, cache) / "head"


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
    target = target_for(hardware)
    manifest, drafter = load_package(package, target)
    decoder = build_decoder(target, manifest.plan(Path(package)), drafter=drafter)
    return collect(
        prompts,
        decoder=decoder,
        tokenizer=target.tokenizer,
        store_root=store_root,
        run_id=run_id,
        hardware=hardware.name,
        drafter_version=draft_label,
        max_new_tokens=max_new_tokens,
        failure_threshold=failure_threshold,
        progress=progress,
    )


def validate_store_step(
    store_root: Path,
    out_dir: Path,
    *,
    window: int = 50,
    threshold: float = 0.5,
    full: bool = False,
) -> CurateSummary:
    """Great Expectations validation with quarantine, the dataset, rolling acceptance.
    Validates only the parts earlier runs into ``out_dir`` did not (``full``: all)."""
    return curate(store_root, out_dir, window=window, threshold=threshold, full=full)


def retention_step(
    store_root: Path, dataset_dir: Path, *, days: float | None = None, now: float
) -> RetentionReport:
    """Remove the store's traffic older than ``days`` (default ``configs/store.yaml``'s
    ``retention.days``) and every copy the dataset folder's validation kept of it: run
    before validation (:mod:`tasks.data.retention`)."""
    from tasks.data.retention import apply_retention, check_days, load_store_config

    days = load_store_config().retention.days if days is None else check_days(days)
    return apply_retention(store_root, [dataset_dir], max_age_days=days, now=now)


def builtin_package(
    drafter: str,
    folder: Path,
    *,
    k: int = DEFAULT_K,
    policy: str = DEFAULT_POLICY,
    family: str = "ngram",
) -> Path:
    """A draft package of a drafter that needs no files (prompt lookup, the n-gram store,
    the target's first layers), ready to register: how a fresh registry gets its first
    champion."""
    plan = DraftPlan.parse(drafter, policy=policy, k=k)
    if plan.drafter.kind not in BUILTIN_KINDS:
        raise BadInputError(
            f"drafter {drafter!r} needs files; bootstrap with one of "
            f"{', '.join(BUILTIN_KINDS)} (e.g. pld:3), or train a draft package "
            "(`specops train-draft`) and register it"
        )
    manifest = DraftManifest.of(plan, family=family, description="built-in drafter")
    return write_package(Path(folder) / drafter.replace(":", "-"), manifest)


def trainable_records(
    store_root: Path, dataset_dir: Path, *, hardware: str | None = None
) -> list[RequestRecord]:
    """The store's train-split records less the held-out traffic (the newest share per
    workload, ``heldout_traffic.jsonl`` of the dataset): what a challenger may learn from."""
    from tasks.train.suffix_index import read_valid_records

    held = {r.id for r in read_part(dataset_dir, "heldout_traffic")}
    return [
        r
        for r in read_valid_records(store_root, hardware=hardware)
        if r.split == "train" and r.id not in held
    ]


def train_suffix_challenger(
    records: Sequence[RequestRecord | Sequence[int]],
    out_dir: Path,
    *,
    k: int = DEFAULT_K,
    source: str = "the store",
) -> Path:
    """A suffix-decoding draft whose corpus is the target's outputs in the trainable
    collected traffic (:func:`trainable_records`; token id lists are taken as they come):
    rebuilt from scratch each time, so it follows drift."""
    from tasks.train.suffix_index import build_suffix_index

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "suffix-corpus.json"
    build_suffix_index(records, corpus)
    return write_package(
        out_dir / "suffix",
        DraftManifest(
            drafter="suffix:corpus.json",
            k=k,
            policy=DEFAULT_POLICY,
            family="suffix",
            description=f"suffix corpus of the target's outputs collected in {source}",
        ),
        files={"corpus.json": corpus},
    )


class Decision(BaseModel):
    """What one evaluate-and-promote decided on a hardware target (the flows' result).

    ``results``, ``by_workload`` and ``by_source`` are the evaluation's measured numbers;
    the gates judged the report :func:`~tasks.evaluate.gates.judged_report` gives (the
    same, unless the gates' config prices speed by a fixed profile)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hardware: str
    labels: dict[str, str] = Field(default_factory=dict)  # contender name -> registry label
    champion: str | None
    promoted: str | None  # the new champion's label, or None (champion kept)
    # Export on promotion: backend -> what happened (exported, or why the backend can't
    # load this draft). Each other target then evaluates it (`specops targets evaluate`).
    exports: dict[str, str] = Field(default_factory=dict)
    gates: dict[str, GateResult]  # challenger label -> gate result
    results: Group
    by_workload: dict[str, Group]
    by_source: dict[str, Group] = Field(default_factory=dict)
    # The evaluation's phases in wall seconds (profile, pregate, timed) and the pre-gate's
    # predicted modelled speedups, by contender label.
    phase_s: dict[str, float] = Field(default_factory=dict)
    predicted: dict[str, float | None] = Field(default_factory=dict)


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
    target = target_for(hardware)
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
        registry, report, by_name, hardware=hardware.name, cache=cache, promote=promote, tags=tags
    )


def decide(
    registry: Registry,
    report: EvaluationReport,
    by_name: dict[str, DraftVersion],
    *,
    hardware: str,
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
            registry.tag_version(draft, f"pregate.{hardware}", reason)
            check = Check(name="pre-gate", passed=False, detail=reason)
            gates[name] = GateResult.of([check], config.decided_by)
            continue
        registry.log_evaluation(
            draft,
            hardware,
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
            hardware,
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
        hardware=hardware,
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
