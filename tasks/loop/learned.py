"""The retrain flow's learned challengers: a draft head and a LoRA draft, trained on the
collected store's training mix within each family's time budget, and its step bound when
it has one (``configs/retrain.yaml``).

The training mix (failures 80 % / replay 20 %, :mod:`tasks.data.dataset`) already holds each
request's prompt and the target's own output, so the teacher data is one teacher-forced
pass over them (:func:`tasks.train.store_teacher.build_store_teacher`): nothing is generated.

- **head**: the EAGLE-style head of :mod:`tasks.train.train_head`, continued from
  ``init_head`` (the head family's current champion, or its newest version evaluated on
  this target) when there is one, else from a fresh initialisation;
- **lora**: a LoRA draft of :mod:`tasks.train.distill` (the target's first layers, peft),
  its merge checked against the unmerged adapter, packaged as the adapter alone (merged
  into the target's layers when it loads), or as its re-quantised merge when it was
  trained against a quantised base.

Every family trains in its own folder under ``work`` (keyed by the retrain's run slot), so
a retrain killed in any family's training resumes from its checkpoint when the flow runs
again with the same slot, and spends only what is left of the budget. A family whose data is
below the minimums is skipped with the reason, never registered.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError
from serving.hardware import engine_target
from serving.loader import load_target, set_threads
from serving.security.redact import mask_token
from serving.target import LoadedTarget
from tasks.loop.retrain_config import FamilySettings, LearnedFamily, TargetRetrain
from tasks.train.store_teacher import Answered, TooLittleDataError, build_store_teacher

log = logging.getLogger(__name__)

TEACHER_DIR = "teacher"
# The hardware target trainers load the target as: torch's stock layers, in float32 on the CPU.
TRAINING_HARDWARE = "cpu-stock"


# An MLflow param of a trained version: what its run was (steps, seconds, init, ...).
Param = str | int | float | None


class Trained(BaseModel):
    """One learned challenger: its package, or why it was skipped (the retrain flow's
    ``trained``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: LearnedFamily
    package: Path | None
    skipped: str | None = None
    params: dict[str, Param] = Field(default_factory=dict)  # logged with the version
    # Training curves for MLflow, name -> [(optimiser step, value)].
    curves: dict[str, list[tuple[int, float]]] = Field(default_factory=dict)
    summary: str = ""


@lru_cache(maxsize=2)
def training_target(target: str | None = None) -> LoadedTarget:
    """The target model ``target`` (a source; default: ``SPECOPS_TARGET``,
    :mod:`tasks.settings`) with torch's stock linear layers (:data:`TRAINING_HARDWARE`):
    trainers read its weights (oneDNN-packed layers have none to read), and the LoRA draft
    copies its first layers."""
    if target is None:  # the settings need pydantic-settings, which a GPU kit lacks
        from tasks.settings import loop_settings

        target = loop_settings().target
    return load_target(target, engine_target(TRAINING_HARDWARE))


def _curves(history: Sequence[Any]) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    for point in history:
        for name in ("agreement", "loss"):
            value = getattr(point, name, None)
            if value is not None and value == value:  # not NaN
                curves.setdefault(f"train/{name}", []).append((point.step, float(value)))
        curves.setdefault("train/seconds", []).append((point.step, float(point.train_seconds)))
    return curves


def _run_params(result: Any, settings: FamilySettings) -> dict[str, Param]:
    """What every family logs of its run (a head's TrainResult or a DistillResult)."""
    return {
        "steps": result.steps,
        "train_seconds": round(result.train_seconds, 1),
        "train_sequences": result.train_sequences,
        "resumed_from": "" if result.resumed_from is None else result.resumed_from,
        "budget_seconds": settings.budget_seconds,
    }


def _max_steps(settings: FamilySettings) -> int:
    """The trainer's ``max_steps``: the family's step bound, else so many that the time
    budget decides."""
    return settings.max_steps if settings.max_steps is not None else 10**9


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def train_head_challenger(
    teacher: Path,
    work: Path,
    settings: FamilySettings,
    *,
    init_head: Path | None,
    target: str | None = None,
    progress: bool = True,
) -> Trained:
    from tasks.train.train_head import TrainHeadConfig, train_head, write_head_package

    model = training_target(target).model
    config = TrainHeadConfig(
        teacher_dir=teacher,
        output_dir=work / "head",
        max_steps=_max_steps(settings),
        init_head=init_head,
        **settings.settings,
    )
    result = train_head(config, model, progress=progress, max_train_seconds=settings.budget_seconds)
    first, last = result.history[0], result.final
    origin = f"continued from {init_head}" if init_head else "fresh"
    summary = (
        f"head ({origin}): {result.steps} steps in {result.train_seconds:.0f} s; held-out "
        f"agreement {_fmt(first.agreement)} -> {_fmt(last.agreement)}"
    )
    package = write_head_package(
        result,
        config,
        work / "head-package",
        k=settings.k,
        policy=settings.policy,
        description=summary,
    )
    return Trained(
        family="head",
        package=package,
        params={
            **_run_params(result, settings),
            "init": str(init_head) if init_head else "fresh",
        },
        curves=_curves(result.history),
        summary=summary,
    )


def train_lora_challenger(
    teacher: Path,
    work: Path,
    settings: FamilySettings,
    *,
    target: str | None = None,
    progress: bool = True,
) -> Trained:
    from tasks.train.distill import DistillConfig, distill, write_draft_package

    loaded = training_target(target)
    config = DistillConfig(
        teacher_dir=teacher,
        output_dir=work / "lora",
        kind="lora",
        max_steps=_max_steps(settings),
        **settings.settings,
    )
    result = distill(
        config,
        loaded.model,
        tokenizer=loaded.tokenizer,
        progress=progress,
        max_train_seconds=settings.budget_seconds,
    )
    first, last = result.history[0], result.final
    summary = (
        f"lora ({config.loss}, quantize {config.quantize}): {result.steps} steps in "
        f"{result.train_seconds:.0f} s; held-out agreement {_fmt(first.agreement)} -> "
        f"{_fmt(last.agreement)}"
    )
    package = write_draft_package(
        result, work / "lora-package", k=settings.k, policy=settings.policy, description=summary
    )
    return Trained(
        family="lora",
        package=package,
        params={
            **_run_params(result, settings),
            "loss": config.loss,
            "quantize": config.quantize,
            "merge_max_abs_diff": result.merge_max_abs_diff,
        },
        curves=_curves(result.history),
        summary=summary,
    )


def _head(
    work: Path,
    settings: FamilySettings,
    init_head: Path | None,
    target: str | None,
    progress: bool,
) -> Trained:
    try:
        return train_head_challenger(
            work / TEACHER_DIR,
            work,
            settings,
            init_head=init_head,
            target=target,
            progress=progress,
        )
    except IncompatibleDraftError as error:
        if init_head is None:
            raise
        # The settings changed since the champion head was trained (another width or
        # vocabulary): its weights cannot seed this head, so it starts afresh.
        log.warning("cannot continue the head from %s (%s): training afresh", init_head, error)
        trained = train_head_challenger(
            work / TEACHER_DIR, work, settings, init_head=None, target=target, progress=progress
        )
        return trained.model_copy(
            update={"params": {**trained.params, "init_refused": str(error)[:250]}}
        )


def train_learned_challengers(
    records: Sequence[Answered],
    work: Path,
    config: TargetRetrain,
    *,
    init_head: Path | None = None,
    target: str | None = None,
    progress: bool = True,
) -> list[Trained]:
    """Train every family ``config`` lists on ``records`` (the training mix, and any pairs
    captured in front of vLLM), under ``work``; see the module docstring. Restores torch's
    thread count afterwards."""
    if not config.families:
        return []
    work = Path(work)
    threads = torch.get_num_threads()
    try:
        set_threads(config.threads)
        loaded = training_target(target)
        try:
            build_store_teacher(
                records,
                loaded.model,
                work / TEACHER_DIR,
                eos_token_ids=loaded.eos_token_ids,
                mask_token_id=mask_token(loaded.tokenizer),
                min_sequences=config.min_sequences,
                min_answer_tokens=config.min_answer_tokens,
                progress=progress,
            )
        except TooLittleDataError as error:
            return [Trained(family=f, package=None, skipped=str(error)) for f in config.families]
        out: list[Trained] = []
        for family in config.families:
            settings = config.family(family)
            if family == "head":
                trained = _head(work, settings, init_head, target, progress)
            else:
                try:
                    trained = train_lora_challenger(
                        work / TEACHER_DIR, work, settings, target=target, progress=progress
                    )
                except ModelSourceError as error:
                    # The merge disagreed with the adapter, or the re-quantised merge does
                    # not load or agree: nothing that could serve, so nothing to register.
                    trained = Trained(family=family, package=None, skipped=str(error))
                except BadInputError as error:
                    # Its settings do not fit this target (more draft layers than it has):
                    # said in the flow log; the other families still train.
                    trained = Trained(
                        family=family, package=None, skipped=f"settings do not fit: {error}"
                    )
            log.info("%s", trained.summary)
            out.append(trained)
        return out
    finally:
        torch.set_num_threads(threads)
