"""Cascade specs (``suffix,pld:3,head:PATH``) parsed and built into a drafter and its policy.

Everything a user can get wrong is checked before any model work: an empty stage list, an
unknown or repeated stage, ``none`` as a stage, and a predictor made for another feature
set, another hardware target, or without training rows for one of the stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from serving.engine.cascade.drafter import CascadeDrafter, Stage
from serving.engine.drafters.factory import DrafterSpec, build_drafter
from serving.engine.drafters.kinds import StageName, stage_of
from serving.engine.drafters.plan import CascadePlan
from serving.engine.predictor import (
    AcceptancePredictor,
    PredictorError,
    check_predictor,
    load_predictor,
)
from serving.hardware import HardwareTarget
from serving.target import LoadedTarget


def parse_stages(stages: str | Sequence[str]) -> list[DrafterSpec]:
    """``"suffix,pld:3"`` or ``["suffix", "pld:3"]`` -> drafter specs, checked."""
    return list(CascadePlan.parse(stages).stages)


def stage_kinds(specs: Sequence[DrafterSpec]) -> list[StageName]:
    return [stage_of(spec.kind) for spec in specs]


def check_predictor_for(
    predictor: str | Path, specs: Sequence[DrafterSpec], hardware: HardwareTarget | None
) -> None:
    """Refuse a predictor folder that cannot score this cascade (no weights read)."""
    meta = check_predictor(predictor, hardware=hardware)
    trained = set(meta.get("stages") or ())
    missing = [k for k in stage_kinds(specs) if k not in trained]
    if missing:
        raise PredictorError(
            f"the predictor at {str(predictor)!r} was trained on stages {sorted(trained)} and "
            f"has never seen {missing}; retrain it on records that include them, or use "
            "--no-predictor"
        )


def check_cascade(plan: CascadePlan, hardware: HardwareTarget) -> None:
    """Refuse, before any weights load, a cascade whose predictor folder cannot score it
    on ``hardware``."""
    if plan.predictor is not None:
        check_predictor_for(plan.predictor, plan.stages, hardware)


def build_cascade(
    plan: CascadePlan,
    target: LoadedTarget,
    *,
    predictor: AcceptancePredictor | None = None,
) -> CascadeDrafter:
    """The cascade of ``plan`` (its stages in order) against ``target``, driven by
    ``predictor`` (default: the plan's predictor folder, loaded for the target's hardware;
    None: its running acceptance). Its policy is :class:`CascadePolicy` over it."""
    specs = list(plan.stages)
    kinds = stage_kinds(specs)
    if predictor is None and plan.predictor is not None:
        check_predictor_for(plan.predictor, specs, target.hardware)
        predictor = load_predictor(plan.predictor, hardware=target.hardware)
    if predictor is not None:
        missing = [k for k in kinds if k not in predictor.stages]
        if missing:
            raise PredictorError(f"the predictor has never seen stages {missing}")
    built = []
    for spec, kind in zip(specs, kinds, strict=True):
        drafter = build_drafter(spec, target)
        assert drafter is not None  # 'none' was refused by the plan
        built.append(Stage(str(spec), kind, drafter))
    cascade = CascadeDrafter(
        built, k_max=plan.k, verify_curve=target.hardware.curve, predictor=predictor
    )
    cascade.check_compatible(target.vocab_size)
    return cascade
