"""Batch draft lengths: the shared pass's cost, coordinate ascent, the token budget."""

from __future__ import annotations

import pytest

from serving.curves import PassCost
from serving.engine.batch.plan import Member, plan_batch
from serving.engine.policy import CostAwareK
from serving.errors import BadInputError


def _confident(accept: float = 0.9) -> CostAwareK:
    policy = CostAwareK(k_max=8, prior_accept=accept, prior_strength=1000.0)
    policy.update(0, 0, draft_s=0.0, verify_s=0.01)  # a one-token pass: 10 ms
    return policy


def test_pass_cost_interpolates_the_measured_batch_curve():
    cost = PassCost(batch_curve=((1, 10.0), (9, 14.0), (17, 22.0)))
    assert cost(1) == 1.0
    assert cost(5) == pytest.approx(1.2)
    assert cost(17) == pytest.approx(2.2)
    assert cost(25) == pytest.approx(3.0)  # past the last point: the last slope
    assert PassCost(verify_curve=(1.0, 1.5))(2) == 1.5
    assert PassCost()(4) == 4.0  # nothing measured: a row costs a pass


@pytest.mark.parametrize("curve", [((2, 1.0),), ((1, 1.0), (1, 2.0)), ((1, 1.0), (4, 0.0))])
def test_a_bad_batch_curve_is_refused(curve):
    with pytest.raises(BadInputError, match="batch_curve"):
        PassCost(batch_curve=curve)


def test_alone_the_plan_is_the_policys_own_choice():
    policy = _confident()
    solo = policy.next_k()
    assert plan_batch([Member(k=solo, cap=8, policy=policy)], PassCost(), budget=64) == [solo]


def test_a_wide_pass_makes_drafting_shorter():
    """Cheap rows (a flat curve) pay for long drafts; rows that cost as much as a pass
    (linear) never pay in a full batch: each draft row yields less than a token."""
    flat = PassCost(batch_curve=((1, 1.0), (64, 1.5)))
    linear = PassCost(batch_curve=((1, 1.0), (64, 64.0)))
    members = [Member(k=4, cap=8, policy=_confident()) for _ in range(8)]
    assert min(plan_batch(members, flat, budget=128)) >= 4
    assert plan_batch(members, linear, budget=128) == [0] * 8


def test_other_policies_keep_their_k_and_the_budget_cuts_the_longest():
    members = [Member(k=6, cap=6, policy=None), Member(k=2, cap=2, policy=None)]
    assert plan_batch(members, PassCost(), budget=64) == [6, 2]
    assert plan_batch(members, PassCost(), budget=6) == [2, 2]
    with pytest.raises(BadInputError, match="pending tokens"):
        plan_batch(members, PassCost(), budget=1)
