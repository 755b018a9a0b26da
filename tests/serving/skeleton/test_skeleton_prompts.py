"""The skeleton and branch messages, and the merged answer."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from serving.skeleton.grammar import SkeletonFormat
from serving.skeleton.parse import Skeleton, parse_skeleton
from serving.skeleton.prompts import branch_messages, merge, skeleton_messages

QUESTION = "How do I start running as a beginner?"
SKELETON = Skeleton(direct=False, points=["Get shoes", "Start slow", "Rest days"])


def test_skeleton_request_explains_the_format_and_holds_the_question():
    messages = skeleton_messages(QUESTION, SkeletonFormat(max_points=4))
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[-1]["content"] == QUESTION
    system = messages[0]["content"]
    assert "[PLAN]" in system and "[END]" in system and "[DIRECT]" in system
    assert "2 to 4" in system
    example = system[system.index("[PLAN]\n") :]
    assert parse_skeleton(example).points  # the example obeys the grammar
    assert len(system) < 400  # short: every prompt token costs


def test_branch_messages_ask_for_one_point():
    for index, title in enumerate(SKELETON.points):
        messages = branch_messages(QUESTION, SKELETON, index)
        user = messages[-1]["content"]
        assert QUESTION in user and all(t in user for t in SKELETON.points)
        assert f"point {index + 1} ({title}) only" in user and "1-3 sentences" in user
    with pytest.raises(BadInputError, match="out of range"):
        branch_messages(QUESTION, SKELETON, 3)
    with pytest.raises(BadInputError, match="DIRECT"):
        branch_messages(QUESTION, Skeleton(direct=True), 0)
    with pytest.raises(BadInputError, match="question"):
        branch_messages("  ", SKELETON, 0)


def test_merge_joins_in_order():
    merged = merge(SKELETON, ["  Buy good shoes.\n", "Run 10 minutes.", "Rest twice a week."])
    assert merged == (
        "1. Get shoes: Buy good shoes.\n2. Start slow: Run 10 minutes.\n"
        "3. Rest days: Rest twice a week."
    )
    with pytest.raises(BadInputError, match="3 points, got 2 texts"):
        merge(SKELETON, ["a", "b"])
    with pytest.raises(BadInputError, match="a string"):
        merge(SKELETON, "abc")
