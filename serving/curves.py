"""What a target pass costs on a hardware target, from its measured curves.

A hardware target (:mod:`serving.hardware`) carries its measured ``verify_curve``: a pass
over ``n`` tokens of one request, relative to a one-token pass; and, where profiled, a
``batch_curve`` of packed passes over several requests' rows. The policies
(:mod:`serving.engine.policy`), batch planning (:mod:`serving.engine.batch.plan`) and the
evaluation's modelled speed all price passes with these functions. Pure arithmetic: no
torch, nothing of the engine.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from serving.errors import BadInputError

# Cost of one target pass over n tokens relative to n = 1, on the CPU target (SmolLM2-135M,
# warm cache; measured with `specops profile`, see docs/engine.md). Only the curve's shape is
# assumed: CostAwareK scales it by the times it measures.
DEFAULT_VERIFY_CURVE = (
    1.0,
    1.06,
    1.3,
    1.6,
    1.7,
    1.8,
    1.85,
    2.0,
    2.05,
    2.1,
    2.15,
    2.2,
    2.25,
    2.3,
    2.35,
    2.4,
)


def normalise_curve(verify_curve: tuple[float, ...]) -> tuple[float, ...]:
    """The curve relative to a one-token pass, made non-decreasing (a bigger block never
    costs less)."""
    if not verify_curve or verify_curve[0] <= 0:
        raise BadInputError(f"verify_curve must start with a positive cost, got {verify_curve}")
    normalised = [float(c) / verify_curve[0] for c in verify_curve]
    return tuple(max(normalised[: i + 1]) for i in range(len(normalised)))


def curve_cost(curve: tuple[float, ...], n: int) -> float:
    """Cost of a pass over ``n`` tokens on a normalised ``curve``; past the measured sizes
    it grows at the curve's average slope (never flat: a longer block always costs)."""
    if n <= len(curve):
        return curve[n - 1]
    last, size = curve[-1], len(curve)
    slope = (last - 1.0) / (size - 1) if size > 1 else 0.1
    return last + max(slope, 0.01) * (n - size)


@dataclass(frozen=True)
class BatchLimits:
    max_sequences: int = 8  # requests in one pass
    max_tokens_per_pass: int = 64  # pending tokens plus drafts, all requests together

    def __post_init__(self) -> None:
        if self.max_sequences < 1:
            raise BadInputError(f"max_sequences must be >= 1, got {self.max_sequences}")
        if self.max_tokens_per_pass < self.max_sequences:
            raise BadInputError(
                f"max_tokens_per_pass ({self.max_tokens_per_pass}) must be at least "
                f"max_sequences ({self.max_sequences}): every request's pending token rides"
            )


@dataclass(frozen=True)
class PassCost:
    """``C(n)``: a pass over ``n`` packed rows, in one-token passes."""

    verify_curve: tuple[float, ...] = ()  # single-sequence, n = 1, 2, ...
    batch_curve: tuple[tuple[int, float], ...] = ()  # measured (rows, cost) points

    def __post_init__(self) -> None:
        points = self.batch_curve
        if points:
            rows = [r for r, _ in points]
            if rows != sorted(set(rows)) or rows[0] != 1 or any(c <= 0 for _, c in points):
                raise BadInputError(
                    f"batch_curve must be (rows, cost) points with rows rising from 1 and "
                    f"positive costs, got {list(points)}"
                )

    def __call__(self, n: int) -> float:
        points = self.batch_curve
        if points:
            rows = [r for r, _ in points]
            base = points[0][1]
            if n >= rows[-1]:
                (r0, c0), (r1, c1) = points[-2] if len(points) > 1 else points[-1], points[-1]
                slope = (c1 - c0) / (r1 - r0) if r1 > r0 else 0.0
                return (c1 + max(slope, 0.0) * (n - r1)) / base
            i = bisect.bisect_right(rows, n) - 1
            (r0, c0), (r1, c1) = points[i], points[i + 1]
            return (c0 + (c1 - c0) * (n - r0) / (r1 - r0)) / base
        if self.verify_curve:
            return curve_cost(normalise_curve(self.verify_curve), n)
        return float(n)  # nothing measured: every row costs as much as a pass
