"""The cascade's plan against a brute-force search that enumerates acceptance outcomes."""

from __future__ import annotations

import itertools
import random

import pytest

from serving.curves import DEFAULT_VERIFY_CURVE, curve_cost, normalise_curve
from serving.engine.cascade.plan import StageOption, plan

CURVE = normalise_curve(DEFAULT_VERIFY_CURVE)


def cost(n: int) -> float:
    return curve_cost(CURVE, n)


def expected_by_enumeration(probs: list[float]) -> float:
    """Sum over every accept/reject pattern of its probability times the tokens it yields
    (the accepted prefix plus the target's own token)."""
    total = 0.0
    for pattern in itertools.product([True, False], repeat=len(probs)):
        chance = 1.0
        for p, kept in zip(probs, pattern, strict=True):
            chance *= p if kept else 1 - p
        prefix = next((i for i, kept in enumerate(pattern) if not kept), len(probs))
        total += chance * (prefix + 1)
    return total


def brute_force(options: list[StageOption], sunk: float) -> tuple[int, int, float]:
    best = (-1, 0, 1.0 / (sunk + cost(1)))
    for s, option in enumerate(options):
        for length in range(1, len(option.probs) + 1):
            tokens = expected_by_enumeration(list(option.probs[:length]))
            spent = sunk + option.call_cost + option.token_cost * length + cost(length + 1)
            rate = tokens / spent
            if rate > best[2] * (1 + 1e-12):
                best = (s, length, rate)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_plan_matches_brute_force(seed):
    rng = random.Random(seed)
    options = [
        StageOption(
            [rng.random() ** rng.choice([0.3, 1, 3]) for _ in range(rng.randint(0, 6))],
            call_cost=rng.choice([0.0, 0.05, 0.3]),
            token_cost=rng.choice([0.0, 0.02, 0.2, 0.6]),
        )
        for _ in range(rng.randint(1, 4))
    ]
    sunk = rng.choice([0.0, 0.01, 0.2])
    choice = plan(options, cost, sunk=sunk)
    stage, length, rate = brute_force(options, sunk)
    assert (choice.stage, choice.length) == (stage, length)
    assert choice.rate == pytest.approx(rate)


def test_plain_decoding_when_nothing_pays():
    choice = plan([StageOption([0.01, 0.01]), StageOption([0.9], token_cost=5.0)], cost)
    assert (choice.stage, choice.length) == (-1, 0)


def test_a_cheap_sure_block_wins_over_a_costly_one():
    sure = StageOption([0.99] * 6)
    costly = StageOption([0.99] * 6, token_cost=0.5)
    choice = plan([costly, sure], cost)
    assert choice.stage == 1 and choice.length == 6
