"""The skeleton grammar and its strict parser."""

from __future__ import annotations

import random
import re

import pytest

from serving.errors import BadInputError
from serving.skeleton.grammar import DEFAULT_FORMAT, SkeletonFormat
from serving.skeleton.parse import Skeleton, parse_skeleton


def test_plan_and_direct_parse():
    text = "[PLAN]\n1. Gather the materials\n2. Cut: 3 pieces (1 m)\n3. Café – 准备\n[END]"
    assert parse_skeleton(text) == Skeleton(
        direct=False, points=["Gather the materials", "Cut: 3 pieces (1 m)", "Café – 准备"]
    )
    assert parse_skeleton("[DIRECT]") == Skeleton(direct=True, points=[])


def test_round_trips():
    rng = random.Random(0)
    words = ["Plan", "the", "trip", "3", "days", "budget:", "$200", "(maybe)", "é", "—"]
    for _ in range(200):
        count = rng.randint(DEFAULT_FORMAT.min_points, DEFAULT_FORMAT.max_points)
        points = [" ".join(rng.choices(words, k=rng.randint(1, 8))) for _ in range(count)]
        skeleton = Skeleton(direct=False, points=points)
        assert parse_skeleton(skeleton.to_text()) == skeleton
    assert parse_skeleton(Skeleton(direct=True).to_text()) == Skeleton(direct=True)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[PLAN]\n1. Only one\n[END]",
        "[PLAN]\n1. a\n3. b\n[END]",
        "[PLAN]\n2. a\n3. b\n[END]",
        "[PLAN]\n" + "".join(f"{i}. p\n" for i in range(1, 8)) + "[END]",
        "[PLAN]\n1. a [b]\n2. c\n[END]",
        "[PLAN]\n1. " + "x" * 81 + "\n2. c\n[END]",
        "[PLAN]\n1. \n2. c\n[END]",
        "[PLAN]\n1.  a\n2. c\n[END]",
        "[PLAN]\n1. a \n2. c\n[END]",
        "[PLAN]\n1. a\tb\n2. c\n[END]",
        "[PLAN]\n1. a\r\n2. c\n[END]",
        "[PLAN]\n1. a\n2. c\n[END]\n",
        " [DIRECT]",
        "[DIRECT]\n",
        "[direct]",
        "[PLAN]\n1. a\n2. b\n",
    ],
)
def test_anything_outside_the_grammar_is_refused(text):
    with pytest.raises(BadInputError, match="not a skeleton"):
        parse_skeleton(text)


def test_title_length_bound_is_exact():
    assert parse_skeleton("[PLAN]\n1. " + "x" * 80 + "\n2. y\n[END]").points[0] == "x" * 80
    fmt = SkeletonFormat(max_title_chars=1)
    assert parse_skeleton("[PLAN]\n1. a\n2. b\n[END]", fmt).points == ["a", "b"]
    with pytest.raises(BadInputError):
        parse_skeleton("[PLAN]\n1. ab\n2. b\n[END]", fmt)


def test_formats_are_configurable_and_checked():
    fmt = SkeletonFormat(min_points=3, max_points=3, max_title_chars=10)
    assert re.fullmatch(fmt.regex(), "[PLAN]\n1. a\n2. b\n3. c\n[END]")
    assert not re.fullmatch(fmt.regex(), "[PLAN]\n1. a\n2. b\n[END]")
    assert not re.fullmatch(fmt.regex(), "[PLAN]\n1. a\n2. b\n3. c\n4. d\n[END]")
    wide = SkeletonFormat(max_points=11)
    assert parse_skeleton(Skeleton(False, [str(i) for i in range(11)]).to_text(), wide)
    with pytest.raises(BadInputError, match="min_points"):
        SkeletonFormat(min_points=4, max_points=3)
    with pytest.raises(BadInputError, match="max_title_chars"):
        SkeletonFormat(max_title_chars=0)
    with pytest.raises(BadInputError, match="a skeleton is text"):
        parse_skeleton(b"[DIRECT]")  # type: ignore[arg-type]
