"""Cascade specs (``suffix,pld:3,head:PATH``) parsed and built into a drafter and its policy.

Everything a user can get wrong is checked before any model work: an empty stage list, an
unknown or repeated stage, ``none`` as a stage, and a predictor made for another feature
set, another hardware target, or without training rows for one of the stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from serving.cascade.drafter import CascadeDrafter, CascadePolicy, Stage
from serving.drafters.factory import DrafterSpec, build_drafter, parse_drafter_spec
from serving.drafters.kinds import StageName, stage_of
from serving.errors import BadInputError
from serving.predictor import AcceptancePredictor, PredictorError, check_predictor, load_predictor


def parse_stages(stages: str | Sequence[str]) -> list[DrafterSpec]:
    """``"suffix,pld:3"`` or ``["suffix", "pld:3"]`` -> drafter specs, checked."""
    items = stages.split(",") if isinstance(stages, str) else list(stages)
    items = [item.strip() for item in items if item and item.strip()]
    if not items:
        raise BadInputError(
            f"the cascade's stage list {stages!r} is empty; give drafters in order, "
            "e.g. suffix,pld:3,head:PATH"
        )
    specs = [parse_drafter_spec(item) for item in items]
    for spec in specs:
        if spec.kind == "none":
            raise BadInputError(
                "'none' is not a cascade stage: the target is always the last stage"
            )
    seen: set[str] = set()
    for spec in specs:
        if str(spec) in seen:
            raise BadInputError(f"cascade stage {str(spec)!r} appears twice in {stages!r}")
        seen.add(str(spec))
    return specs


def stage_kinds(specs: Sequence[DrafterSpec]) -> list[StageName]:
    return [stage_of(spec.kind) for spec in specs]


def check_predictor_for(
    predictor: str | Path, specs: Sequence[DrafterSpec], hardware: str | None
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


def build_cascade(
    stages: str | Sequence[str],
    target,
    *,
    verify_curve: tuple[float, ...],
    tokenizer=None,
    k_max: int = 8,
    predictor: AcceptancePredictor | str | Path | None = None,
    hardware: str | None = None,
) -> tuple[CascadeDrafter, CascadePolicy]:
    """The cascade over ``stages`` (in order) against ``target``, and its policy."""
    specs = parse_stages(stages)
    if isinstance(predictor, (str, Path)):
        check_predictor_for(predictor, specs, hardware)
    kinds = stage_kinds(specs)
    if isinstance(predictor, AcceptancePredictor):
        missing = [k for k in kinds if k not in predictor.stages]
        if missing:
            raise PredictorError(f"the predictor has never seen stages {missing}")
    loaded = (
        load_predictor(predictor, hardware=hardware)
        if isinstance(predictor, (str, Path))
        else predictor
    )
    built = []
    for spec, kind in zip(specs, kinds, strict=True):
        drafter = build_drafter(spec, target, tokenizer)
        assert drafter is not None  # 'none' was refused above
        built.append(Stage(str(spec), kind, drafter))
    cascade = CascadeDrafter(built, k_max=k_max, verify_curve=verify_curve, predictor=loaded)
    cascade.check_compatible(int(target.config.vocab_size))
    return cascade, CascadePolicy(cascade)
