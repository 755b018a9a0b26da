"""The loop's predictor step: retrain the acceptance predictor on the validated traffic,
register it as the target's challenger, and promote it only through the gates.

The gate run is the drafts' own (:func:`tasks.evaluate.evaluate.evaluate`): interleaved on
held-out prompts, greedy, every output checked against plain decoding. The champion draft
runs twice - under the current policy (the champion predictor when the target has one,
otherwise the package's own draft-length policy) and as a one-stage cascade driven by the
new predictor - and the predictor is promoted when that is faster by the gates' margin,
lossless, with no workload slowed beyond the gates' limit. Mean accepted length is not
gated: drafting less can be the faster choice, which is what a predictor is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from registry.client import Registry
from registry.predictor import (
    PREDICTOR_FAMILY,
    champion_predictor,
    download_predictor,
    log_predictor,
    predictor_model,
    promote_predictor,
    set_predictor_challenger,
)
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from tasks.data.prompts import Prompt
from tasks.evaluate import gates as gate_config
from tasks.evaluate.evaluate import Contender, EncodedPrompt, evaluate_report
from tasks.evaluate.gates import Check, GateResult, gate, judged_report
from tasks.loop import targets
from tasks.train.predictor import train_predictor


class PredictorOutcome(BaseModel):
    """What the predictor step did (the retrain flow's ``predictor``)."""

    model_config = ConfigDict(extra="forbid")  # filled in as the step goes

    hardware: str
    skipped: str | None = None  # why no predictor was trained or judged
    challenger: str | None = None  # the registered version's label
    champion: str | None = None  # the predictor champion when judged (None: none)
    promoted: str | None = None
    gate: GateResult | None = None
    metrics: dict[str, float] = Field(default_factory=dict)  # held-out AUC, Brier, ECE


def retrain_predictor(
    registry: Registry,
    dataset: Path,
    out: Path,
    prompts: Sequence[Prompt | EncodedPrompt],
    *,
    hardware: HardwareTarget,
    cache: Path,
    max_new_tokens: int,
    tags: dict[str, str] | None = None,
    promote: bool = True,
    progress: bool = False,
    key: str | None = None,
) -> PredictorOutcome:
    """Retrain the predictor of ``hardware`` (a target of any backend) and, where the
    specops engine serves it, judge it there (see the module docstring; elsewhere the
    outcome says why it was not judged). ``key`` (the retrain's
    ``<hw>/<slot>/predictor``): a version already registered under it is reused, so a
    re-run of a crashed retrain registers nothing twice."""
    name = hardware.name  # the registry's key, and the records'
    outcome = PredictorOutcome(hardware=name)
    try:
        trained = train_predictor(dataset, out / "predictor", hardware=hardware, progress=progress)
    except BadInputError as error:  # e.g. only v1 records, one label: said, not hidden
        outcome.skipped = f"no predictor trained: {error}"
        return outcome
    outcome.metrics = {k: float(v) for k, v in trained.evaluation.flat().items()}
    curves: dict[str, Sequence[tuple[int, float]]] = dict(trained.curves())
    found = None
    if key is not None:
        found = registry.find_version(predictor_model(registry), PREDICTOR_FAMILY, run_key=key)
        tags = {**(tags or {}), "run_key": key}
    version = found or log_predictor(
        registry,
        trained.folder,
        metrics=outcome.metrics,
        params=trained.params(),
        tags=tags,
        curves=curves,
    )
    set_predictor_challenger(registry, version, name)
    outcome.challenger = version.label
    draft = registry.champion(name)
    if draft is None:
        outcome.skipped = f"{name} has no champion draft for the predictor to drive"
        return outcome
    package = registry.download(draft, cache)
    current = champion_predictor(registry, name)
    outcome.champion = current.label if current else None
    current_folder = download_predictor(registry, current, cache) if current else None
    try:
        contenders = [
            Contender("champion", package, predictor=current_folder),
            Contender("challenger", package, predictor=trained.folder),
        ]
        target = targets.target_for(targets.engine_of(hardware))
        config = gate_config.load_gates()
        report = evaluate_report(
            contenders,
            prompts,
            target=target,
            max_new_tokens=max_new_tokens,
            rounds=config.wall_clock_rounds,
            stop_confidence=config.wall_clock_confidence,
            pregate_margin=config.pregate_margin,  # the same draft under another k: exact
            progress=progress,
        )
    except BadInputError as error:  # the predictor never saw the champion's kind of draft
        outcome.skipped = f"not judged: {error}"
        return outcome
    if "challenger" in report.untimed:
        reason = report.untimed["challenger"]
        check = Check(name="pre-gate", passed=False, detail=reason)
        outcome.gate = GateResult.of([check], config.decided_by)
        return outcome
    judged = judged_report(report, config)
    result = gate(
        judged,
        challenger="challenger",
        champion="champion",
        check_acceptance=False,
        config=config,
    )
    outcome.gate = result
    if result.passed and promote:
        promote_predictor(
            registry,
            version,
            name,
            reason=result.reason,
            metrics={
                "speedup": float(judged.results["challenger"].speedup or 0.0),
                "champion_speedup": float(judged.results["champion"].speedup or 0.0),
            },
            expected_champion=outcome.champion,
        )
        outcome.promoted = version.label
    return outcome
