"""The chat messages of skeleton-of-thought decoding, and the merged answer.

1. :func:`skeleton_messages`: ask for the plan (the format, one short example, the
   question); it is decoded under :class:`serving.skeleton.constraint.SkeletonConstraint`.
2. :func:`branch_messages`: one per point, each asking to expand that point only, in 1-3
   sentences, with the question and the whole plan for context; decoded as a batch.
3. :func:`merge`: the branches joined in point order as ``"1. title: text"`` lines.

The texts are short on purpose: the model is a 135M-parameter chat model and every
prompt token is paid for once per branch. Messages are ``{"role", "content"}`` dicts;
the caller applies the tokenizer's chat template.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.errors import BadInputError
from serving.skeleton.grammar import DEFAULT_FORMAT, SkeletonFormat
from serving.skeleton.parse import Skeleton

_EXAMPLE = Skeleton(
    direct=False, points=["Preheat the oven", "Mix the batter", "Bake for 30 minutes"]
)


def skeleton_messages(question: str, fmt: SkeletonFormat = DEFAULT_FORMAT) -> list[dict[str, str]]:
    """Ask for a plan of ``fmt.min_points``-``fmt.max_points`` short points, or [DIRECT]."""
    _check_question(question)
    system = (
        "Plan the answer, do not write it. Reply with [PLAN], then "
        f"{fmt.min_points} to {fmt.max_points} numbered points of a few words, one per "
        "line, then [END]. If the question needs no plan, reply [DIRECT].\n"
        f"Example for 'How do I bake a cake?':\n{_EXAMPLE.to_text()}"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def branch_messages(question: str, skeleton: Skeleton, index: int) -> list[dict[str, str]]:
    """Expand point ``index`` (0-based) of ``skeleton`` only, in 1-3 sentences."""
    _check_question(question)
    points = _plan_points(skeleton)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(points):
        raise BadInputError(
            f"point index {index!r} is out of range: the skeleton has {len(points)} points "
            "(indices start at 0)"
        )
    plan = "\n".join(f"{i}. {title}" for i, title in enumerate(points, start=1))
    user = (
        f"Question: {question}\n\nPlan:\n{plan}\n\n"
        f"Write point {index + 1} ({points[index]}) only, in 1-3 sentences."
    )
    return [
        {"role": "system", "content": "You expand one point of a plan, briefly."},
        {"role": "user", "content": user},
    ]


def merge(skeleton: Skeleton, branch_texts: Sequence[str]) -> str:
    """``"1. title: text\\n2. title: text..."``, one line per point in order (each branch
    text stripped)."""
    points = _plan_points(skeleton)
    if isinstance(branch_texts, str) or len(branch_texts) != len(points):
        count = "a string" if isinstance(branch_texts, str) else f"{len(branch_texts)} texts"
        raise BadInputError(
            f"merge needs one branch text per point: the skeleton has {len(points)} points, "
            f"got {count}"
        )
    return "\n".join(
        f"{i}. {title}: {text.strip()}"
        for i, (title, text) in enumerate(zip(points, branch_texts, strict=True), start=1)
    )


def _plan_points(skeleton: Skeleton) -> list[str]:
    if skeleton.direct or not skeleton.points:
        raise BadInputError(
            "a [DIRECT] skeleton has no points to expand; answer the question in one piece"
        )
    return skeleton.points


def _check_question(question: str) -> None:
    if not isinstance(question, str) or not question.strip():
        raise BadInputError(f"the question must be non-empty text, got {question!r}")
