"""A skeleton-of-thought answer as `specops generate --skeleton` reports it: the JSON
object's fields and rounding, and which points hit their budget."""

from __future__ import annotations

from serving.skeleton.decode import Branch, SkeletonAnswer
from serving.skeleton.parse import Skeleton
from tasks.bench.skeleton import answer_summary, truncated_points


def _answer() -> SkeletonAnswer:
    return SkeletonAnswer(
        text="1. Plan: a\n2. Cook: b",
        skeleton=Skeleton(direct=False, points=["Plan", "Cook"]),
        skeleton_text="[PLAN]\n1. Plan\n2. Cook\n[END]",
        skeleton_tokens=9,
        branches=[Branch("Plan", "a", 3, False), Branch("Cook", "b", 4, True)],
        truncated=True,
        skeleton_s=0.12345,
        answer_s=1.23456,
    )


def test_the_summary_carries_every_branch_and_rounded_times():
    assert answer_summary(_answer()) == {
        "text": "1. Plan: a\n2. Cook: b",
        "skeleton": "[PLAN]\n1. Plan\n2. Cook\n[END]",
        "direct": False,
        "branches": [
            {"point": "Plan", "text": "a", "tokens": 3, "truncated": False},
            {"point": "Cook", "text": "b", "tokens": 4, "truncated": True},
        ],
        "truncated": True,
        "completion_tokens": 16,  # the skeleton's 9 and the branches' 3 + 4
        "skeleton_s": 0.123,
        "answer_s": 1.235,
    }


def test_truncated_points_are_numbered_from_one():
    assert truncated_points(_answer()) == [2]
    assert truncated_points(SkeletonAnswer("x", Skeleton(direct=True), "[DIRECT]", 2)) == []
