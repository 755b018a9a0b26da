"""What a command decodes with, parsed from its options before any weights load: the draft
plan (:func:`draft_plan`) of its ``--drafter/--policy/--k`` (or ``--cascade/--predictor``),
and the target (:func:`load_engine_target`), loaded as its hardware target loads it
(kernels, device, dtype) once torch's threads are set.

Imported by the command modules at start-up, so it imports torch (through the engine) only
inside its functions: ``specops --help`` does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from serving.engine.drafters.plan import Plan
    from serving.hardware import HardwareTarget
    from serving.target import LoadedTarget


def draft_plan(
    drafter: str,
    *,
    policy: str,
    k: int,
    hardware: HardwareTarget,
    cascade: str | None = None,
    predictor: str | None = None,
) -> Plan:
    """The plan the options name, every part checked (a :class:`BadInputError` naming the
    first bad one): with ``cascade``, its stages, ``k`` as its largest block and
    ``predictor`` (checked against ``hardware``); otherwise ``drafter`` under ``policy``
    and ``k``. Nothing loads."""
    from serving.engine.cascade.build import check_cascade
    from serving.engine.drafters.plan import CascadePlan, DraftPlan
    from serving.errors import BadInputError

    if cascade is not None:
        plan = CascadePlan.parse(cascade, k=k, predictor=predictor)
        check_cascade(plan, hardware)
        return plan
    if predictor is not None:
        raise BadInputError("an acceptance predictor needs a cascade (--cascade STAGES)")
    return DraftPlan.parse(drafter, policy=policy, k=k)


def load_engine_target(source: str, hardware: HardwareTarget, threads: int) -> LoadedTarget:
    """``source`` (``smollm2`` or a model folder) loaded for ``hardware``, with torch's
    threads set first; a bad ``threads`` raises :class:`~serving.errors.BadInputError`
    before any model is loaded."""
    from serving.loader import load_target, set_threads

    set_threads(threads)
    return load_target(source, hardware)


def tokenizer_of(target: LoadedTarget) -> PreTrainedTokenizerBase:
    """The tokenizer ``target`` was loaded with (:func:`serving.loader.load_target` always
    loads one beside the model)."""
    assert target.tokenizer is not None, f"target {target.source!r} was loaded without a tokenizer"
    return target.tokenizer


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """``ids`` (one sequence) as text, special tokens skipped."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string
    return text
