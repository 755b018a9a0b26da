"""How sure the wall clock is: a bootstrap interval of the per-prompt speed ratio.

For each prompt, the ratio of two contenders' wall-clock speeds (tokens over the mean of
their timed rounds' seconds); the interval is a percentile bootstrap of the geometric mean
of those ratios (``scipy.stats.bootstrap`` over the log ratios, a fixed seed, so the same
report always gives the same interval). The gates require a promoted challenger's
interval against the champion (or plain decoding) not to lie wholly below 1.0: the clock
may be unsure, but it must not say the challenger is slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap

from serving.errors import BadInputError
from tasks.evaluate.report import EvaluationReport, PromptRun

RESAMPLES = 2000
SEED = 0


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # geometric mean of the per-prompt ratios
    low: float
    high: float
    prompts: int
    confidence: float

    def describe(self, of: str, over: str) -> str:
        return (
            f"wall-clock speed of {of} over {over} {self.ratio:.3f} per prompt, "
            f"{self.confidence:.0%} interval [{self.low:.3f}, {self.high:.3f}] "
            f"({self.prompts} prompts)"
        )


def _speed(run: PromptRun) -> float:
    tokens = float(run.stats.get("generated_tokens", 0))
    return tokens / run.seconds if run.seconds > 0 else 0.0


def wall_clock_interval(
    report: EvaluationReport,
    contender: str,
    baseline: str,
    *,
    keep: Callable[[str], bool] = lambda workload: True,
    confidence: float = 0.95,
) -> RatioInterval:
    """The interval of ``contender``'s wall-clock speed over ``baseline``'s, on the prompts
    whose workload ``keep`` takes. :class:`BadInputError` when the report has no
    per-prompt rows for either, or no prompt both ran."""
    rows = report.per_prompt or {}
    if contender not in rows or baseline not in rows:
        raise BadInputError(
            f"the report has no per-prompt timings for {contender!r} and {baseline!r}: "
            "evaluate again (the evaluation keeps them)"
        )
    logs = [
        math.log(a / b)
        for mine, theirs in zip(rows[contender], rows[baseline], strict=True)
        if keep(mine.workload) and (a := _speed(mine)) > 0 and (b := _speed(theirs)) > 0
    ]
    if not logs:
        raise BadInputError(f"no prompt timed both {contender!r} and {baseline!r}")
    return log_ratio_interval(logs, confidence)


def speed_log_ratios(
    mine: Sequence[tuple[int, float]], theirs: Sequence[tuple[int, float]]
) -> list[float]:
    """Per-prompt log speed ratios from (tokens, seconds) pairs, prompt by prompt; a
    prompt where either produced nothing or took no time is left out."""
    return [
        math.log((a / s) / (b / t))
        for (a, s), (b, t) in zip(mine, theirs, strict=True)
        if a > 0 and s > 0 and b > 0 and t > 0
    ]


def log_ratio_interval(logs: Sequence[float], confidence: float) -> RatioInterval:
    """The percentile bootstrap interval of the geometric mean of per-prompt ratios, given
    their logs (at least one)."""
    centre = math.exp(float(np.mean(logs)))
    if len(logs) < 2 or max(logs) == min(logs):
        return RatioInterval(centre, centre, centre, len(logs), confidence)
    result = bootstrap(
        (np.asarray(logs),),
        np.mean,
        confidence_level=confidence,
        n_resamples=RESAMPLES,
        method="percentile",
        random_state=np.random.default_rng(SEED),
    )
    low, high = result.confidence_interval
    return RatioInterval(centre, math.exp(float(low)), math.exp(float(high)), len(logs), confidence)
