"""Skeleton-of-thought decoding: a constrained plan, its points decoded as one batch.

1. The skeleton: the plan request (:func:`serving.skeleton.prompts.skeleton_messages`)
   decoded with speculation under :class:`SkeletonConstraint`, so it is always a valid
   ``[PLAN] 1. ... [END]`` or ``[DIRECT]`` (the constraint masks the target's processed
   distribution row by row: speculation inside it stays lossless, serving.engine.constrained).
2. ``[DIRECT]``: the question is answered in one piece, as plain decoding would.
3. A plan: one branch request per point, each with its own decoder (own drafter and
   policy), decoded together through one :class:`serving.engine.batch.batch.Batch`; each branch's
   tokens are exactly its solo decoding's. A branch that hits its token budget is reported
   (``truncated``), not cut silently.
4. The branches are merged in point order (:func:`serving.skeleton.prompts.merge`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.curves import BatchLimits, PassCost
from serving.engine.batch.batch import decode_together
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.request import GenerationResult
from serving.engine.sampling import SamplingParams
from serving.errors import SpecOpsError
from serving.loader import encode_messages
from serving.skeleton.constraint import SkeletonConstraint
from serving.skeleton.parse import Skeleton, parse_skeleton
from serving.skeleton.prompts import branch_messages, merge, skeleton_messages


class SkeletonBudgetError(SpecOpsError):
    """The skeleton did not complete within its token budget."""


def skeleton_budget(constraint: SkeletonConstraint) -> int:
    """Tokens enough for the longest skeleton the format allows (a token is at least one
    character): the skeleton can always complete."""
    fmt = constraint.fmt
    return fmt.max_points * (fmt.max_title_chars + 6) + 16


@dataclass(frozen=True)
class Branch:
    point: str
    text: str
    tokens: int
    truncated: bool  # hit max_tokens before EOS


@dataclass
class SkeletonAnswer:
    text: str  # the merged answer (or the direct one)
    skeleton: Skeleton
    skeleton_text: str
    skeleton_tokens: int
    branches: list[Branch] = field(default_factory=list)
    direct_tokens: int = 0
    truncated: bool = False  # a branch (or the direct answer) hit its budget
    skeleton_s: float = 0.0
    answer_s: float = 0.0
    results: list[GenerationResult] = field(default_factory=list)  # skeleton first

    @property
    def completion_tokens(self) -> int:
        return self.skeleton_tokens + self.direct_tokens + sum(b.tokens for b in self.branches)

    @property
    def total_s(self) -> float:
        return self.skeleton_s + self.answer_s


def answer_with_skeleton(
    new_decoder: Callable[[], SpeculativeDecoder],
    tokenizer,
    question: str,
    constraint: SkeletonConstraint,
    *,
    max_tokens: int,
    sampling: SamplingParams | None = None,
    limits: BatchLimits | None = None,
    cost: PassCost | None = None,
) -> SkeletonAnswer:
    """Answer ``question`` by skeleton-of-thought. ``new_decoder()`` gives each request
    (skeleton, each branch) its own decoder on the same target; ``max_tokens`` bounds each
    branch and the direct answer."""
    decoder = new_decoder()
    target = decoder.target
    started = time.perf_counter()
    budget = skeleton_budget(constraint)
    plan_ids = encode_messages(tokenizer, skeleton_messages(question, constraint.fmt))
    plan = decoder.begin(plan_ids, max_new_tokens=budget, sampling=sampling, constraint=constraint)
    (plan_result,) = decode_together([plan], target, limits=limits, cost=cost)
    if plan_result.stop_reason != "eos":
        raise SkeletonBudgetError(
            f"the skeleton did not complete within {budget} tokens "
            f"(stop reason {plan_result.stop_reason!r})"
        )
    skeleton_text = tokenizer.decode(plan_result.token_ids, skip_special_tokens=True)
    skeleton = parse_skeleton(skeleton_text, constraint.fmt)
    answer = SkeletonAnswer(
        text="",
        skeleton=skeleton,
        skeleton_text=skeleton_text,
        skeleton_tokens=len(plan_result.token_ids),
        skeleton_s=time.perf_counter() - started,
        results=[plan_result],
    )
    started = time.perf_counter()
    if skeleton.direct:
        ids = encode_messages(tokenizer, [{"role": "user", "content": question}])
        direct = new_decoder().begin(ids, max_new_tokens=max_tokens, sampling=sampling)
        (result,) = decode_together([direct], target, limits=limits, cost=cost)
        answer.text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        answer.direct_tokens = len(result.token_ids)
        answer.truncated = result.stop_reason == "length"
        answer.results.append(result)
    else:
        decodings = [
            new_decoder().begin(
                encode_messages(tokenizer, branch_messages(question, skeleton, i)),
                max_new_tokens=max_tokens,
                sampling=sampling,
            )
            for i in range(len(skeleton.points))
        ]
        results = decode_together(decodings, target, limits=limits, cost=cost)
        for point, result in zip(skeleton.points, results, strict=True):
            answer.branches.append(
                Branch(
                    point=point,
                    text=tokenizer.decode(result.token_ids, skip_special_tokens=True),
                    tokens=len(result.token_ids),
                    truncated=result.stop_reason == "length",
                )
            )
        answer.results.extend(results)
        answer.truncated = any(b.truncated for b in answer.branches)
        answer.text = merge(skeleton, [b.text for b in answer.branches])
    answer.answer_s = time.perf_counter() - started
    return answer
