"""Splitting by a stable hash of the id (tasks/data/prompts.py)."""

from __future__ import annotations

import re

import pytest

from serving.errors import BadInputError
from tasks.data.prompts import split_of


def test_split_is_deterministic_and_close_to_the_fraction() -> None:
    ids = [f"sharegpt:conv{i}:0" for i in range(20_000)]
    first = [split_of(i) for i in ids]
    assert first == [split_of(i) for i in ids]
    assert set(first) == {"train", "heldout"}
    assert first.count("heldout") / len(ids) == pytest.approx(0.2, abs=0.015)
    half = [split_of(i, heldout_fraction=0.5) for i in ids]
    assert half.count("heldout") / len(ids) == pytest.approx(0.5, abs=0.015)


def test_split_fraction_edges_and_nesting() -> None:
    ids = [f"humaneval:HumanEval/{i}" for i in range(164)]
    assert {split_of(i, 0.0) for i in ids} == {"train"}
    assert {split_of(i, 1.0) for i in ids} == {"heldout"}
    # A larger heldout fraction only moves ids from train to heldout, never back.
    small = {i for i in ids if split_of(i, 0.1) == "heldout"}
    large = {i for i in ids if split_of(i, 0.3) == "heldout"}
    assert small <= large


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_split_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(BadInputError, match=re.escape(str(fraction))):
        split_of("x", heldout_fraction=fraction)
