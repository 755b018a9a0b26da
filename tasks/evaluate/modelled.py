"""Modelled speed: what each contender's recorded checks cost on the target, priced with
the target's verify curve and the contender's own profiled drafting cost.

Under greedy decoding a contender's steps on a prompt — how many drafts each check
proposed and how many were kept — are fixed by the target's output and the drafter, once
its policy prices drafting at a profiled cost instead of the clock
(:func:`tasks.evaluate.costs.fix_draft_cost`). Priced by :class:`~tasks.evaluate.priced.Pricing`
with the verify curve the evaluation ran under (``report.verify_curve``, the target's fixed
one) and each contender's cost per drafted token (``report.draft_costs``), they give a
speedup over plain decoding that a busy core cannot flip: the gates decide on it
(:func:`tasks.evaluate.gates.judged_report`), and the wall clock, timed in rounds beside
it, must not contradict it (:mod:`tasks.evaluate.interval`).

Each prompt's prefill is priced too, in plain decoding's steps, from plain decoding's own
run of that prompt (:func:`tasks.evaluate.priced.prefill_costs`): the same for every
contender, so it cannot change their order, but a measured speedup includes it. Left out:
the engine's own bookkeeping per check and a neural drafter's own prefill.

``curve="evaluated"`` prices with the curve the evaluation's own timed passes followed
instead (``report.evaluated_curve``, :mod:`tasks.evaluate.evaluated_curve`); the gates do
not, the studies compare the two (``benchmarks/modelled_speed.py``,
``benchmarks/gate_stability.py``). How close either is to the wall clock: docs/loop.md,
"How close the modelled speed is".
"""

from __future__ import annotations

from typing import Literal

from serving.errors import BadInputError
from tasks.evaluate.priced import Pricing, prefill_costs, priced_report
from tasks.evaluate.report import REFERENCE, EvaluationReport

REMEDY = (
    "evaluate again (the evaluation profiles every drafter before timing it), or price it "
    "with a fixed `speed_profile` (configs/gates.yaml)"
)


def drafted(report: EvaluationReport, name: str) -> bool:
    """Whether ``name`` proposed any draft in ``report``."""
    runs = (report.per_prompt or {}).get(name, [])
    return any(proposed > 0 for run in runs for proposed, _ in run.steps)


Curve = Literal["evaluated", "profiled"]  # the evaluation's own curve, or the target's fixed one


def modelled_pricing(report: EvaluationReport, curve: Curve = "profiled") -> Pricing:
    """The pricing of ``report``'s own measurements; :class:`BadInputError` naming what is
    missing (an older report, or a drafter whose cost could not be profiled). With
    ``curve="evaluated"`` and no evaluated curve in the report (an older one, or too few
    timed passes), the profiled curve prices it."""
    if not report.verify_curve:
        raise BadInputError(
            f"this evaluation on {report.hardware!r} recorded no verify curve, so its speed "
            f"cannot be modelled: {REMEDY}"
        )
    missing = [
        name
        for name in (report.per_prompt or {})
        if name != REFERENCE and name not in report.draft_costs and drafted(report, name)
    ]
    if missing:
        raise BadInputError(
            f"this evaluation on {report.hardware!r} has no profiled drafting cost for "
            f"{missing}, so their speed cannot be modelled: {REMEDY}"
        )
    prefills = prefill_costs((report.per_prompt or {}).get(REFERENCE, []))
    verify = report.evaluated_curve if curve == "evaluated" else []
    return Pricing(verify or report.verify_curve, 0.0, report.draft_costs, prefills)


def modelled_report(report: EvaluationReport, curve: Curve = "profiled") -> EvaluationReport:
    """``report`` with every speedup (overall, per workload, per source) modelled; its
    measured tokens/s and per-prompt seconds kept as they were."""
    return priced_report(report, modelled_pricing(report, curve))
