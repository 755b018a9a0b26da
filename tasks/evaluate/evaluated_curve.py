"""The verify curve an evaluation's own passes followed.

The target's profiled curve (``configs/hardware.yaml``, ``specops profile``) says what a
pass over ``n`` tokens costs against a one-token pass, measured once, at one context
length, on a quiet machine. On a shared host the ratio moves with the neighbours' load (a
one-token pass is bound by memory, several tokens by arithmetic: docs/loop.md, "How close
the modelled speed is"), and a modelled speed priced with the profiled curve then misses
the wall clock by as much. The evaluation's timed rounds verify hundreds of blocks of each
size, interleaved, under the load the evaluation actually saw; the median seconds of a
pass over ``n`` tokens over the median of a one-token pass is the curve they followed.

Medians, not means: a pass the machine stalled on moves a mean, not the median. A size
with fewer than ``min_passes`` passes takes the profiled value times the measured-over-
profiled ratio, interpolated between the measured sizes around it (the largest measured
size's ratio past it); the curve is then made non-decreasing, and with too few one-token
passes there is none.

Pooled over several evaluations (:func:`pooled_curve`), the same numbers give a fixed
curve for ``configs/hardware.yaml``: what the host's passes typically cost, for a modelled
speed that is both close to the wall clock and the same on every re-run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from serving.curves import curve_cost, normalise_curve
from serving.engine.metrics import StepRecord
from serving.errors import BadInputError
from tasks.evaluate.report import EvaluationReport

MIN_PASSES = 8  # passes of one size before its median replaces the profiled value


def verify_seconds_by_size(steps: Iterable[StepRecord]) -> dict[int, list[float]]:
    """Each pass's verify seconds, by the tokens it verified (drafts + 1)."""
    by_size: dict[int, list[float]] = {}
    for step in steps:
        if step.verify_s > 0:
            by_size.setdefault(step.proposed + 1, []).append(step.verify_s)
    return by_size


def evaluated_curve(
    steps: Iterable[StepRecord], profiled: Sequence[float], min_passes: int = MIN_PASSES
) -> tuple[list[float], list[int]]:
    """The curve ``steps`` followed, and how many passes of each size it rests on (0 where
    the profiled value stands); ``([], [])`` with fewer than ``min_passes`` one-token
    passes. As long as the profiled curve, or as the largest size measured."""
    by_size = verify_seconds_by_size(steps)
    if len(by_size.get(1, ())) < min_passes:
        return [], []
    unit = statistics.median(by_size[1])
    base = normalise_curve(tuple(profiled))
    measured = {n: s for n, s in by_size.items() if len(s) >= min_passes}
    size = max(len(base), *measured)
    # measured over profiled, at each measured size (size 1 always among them)
    ratio = {n: statistics.median(s) / unit / curve_cost(base, n) for n, s in measured.items()}
    sizes = sorted(ratio)
    curve, passes = [], []
    for n in range(1, size + 1):
        below = max(m for m in sizes if m <= n)
        above = min((m for m in sizes if m >= n), default=below)
        share = (n - below) / (above - below) if above > below else 0.0
        scale = ratio[below] + share * (ratio[above] - ratio[below])
        curve.append(curve_cost(base, n) * scale)
        passes.append(len(measured.get(n, ())))
    return list(normalise_curve(tuple(curve))), passes


def rounds_curve(
    timed: Sequence[StepRecord], recorded: Sequence[StepRecord], profiled: Sequence[float]
) -> tuple[list[float], list[int]]:
    """The curve an evaluation's timed rounds followed (``timed``: every contender's steps,
    interleaved). Plain decoding's recording (``recorded``: the pre-gate's, timed before the
    rounds, under whatever load there was then) joins only where the rounds verified too
    few one-token blocks to set the curve's unit: mixing time windows would put the load
    of one into the unit of the other."""
    curve, passes = evaluated_curve(timed, profiled)
    if not curve and recorded:
        return evaluated_curve([*recorded, *timed], profiled)
    return curve, passes


def pooled_curve(
    reports: Sequence[EvaluationReport], hardware_name: str
) -> tuple[list[float], int]:
    """One curve from several evaluations' evaluated curves on the hardware target
    ``hardware_name`` (the name every report must carry; reports from elsewhere may name a
    target this machine's ``configs/hardware.yaml`` lacks): per size, the median over the
    evaluations that verified blocks of that size (over all of them where none did), made
    non-decreasing; and how many passes it rests on. A fixed curve a target's
    ``verify_curve`` can take (``specops profile --from-evaluation``): the host's typical
    passes, not one quiet moment's."""
    if not reports:
        raise BadInputError("no evaluation reports to pool a verify curve from")
    for index, report in enumerate(reports):
        if report.hardware != hardware_name:
            raise BadInputError(
                f"evaluation {index + 1} ran on {report.hardware!r}, not on {hardware_name!r}"
            )
        if not report.evaluated_curve:
            raise BadInputError(
                f"evaluation {index + 1} has no evaluated verify curve (an older report, or "
                "too few timed passes): evaluate again"
            )
    size = max(len(r.evaluated_curve) for r in reports)
    curve = []
    for n in range(size):
        seen = [r for r in reports if n < len(r.evaluated_passes) and r.evaluated_passes[n] > 0]
        values = [r.evaluated_curve[n] for r in (seen or reports) if n < len(r.evaluated_curve)]
        curve.append(statistics.median(values))
    passes = sum(sum(r.evaluated_passes) for r in reports)
    return list(normalise_curve(tuple(curve))), passes
