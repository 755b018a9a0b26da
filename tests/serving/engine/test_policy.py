from __future__ import annotations

from typing import get_args

import pytest

from serving.engine.policy import (
    POLICIES,
    AdaptiveK,
    CostAwareK,
    FixedK,
    PolicyName,
    check_policy,
    make_policy,
)
from serving.errors import BadInputError

FLAT = (1.0, 1.05, 1.1, 1.12, 1.15, 1.2, 1.25, 1.3, 1.35)


def test_adaptive_grows_after_full_acceptance_and_shrinks_otherwise():
    policy = AdaptiveK(4, k_max=8)
    policy.update(4, 4)
    assert policy.next_k() == 6
    policy.update(6, 2)
    assert policy.next_k() == 5
    policy.begin()
    assert policy.next_k() == 4


def test_cost_policy_drafts_long_blocks_when_drafts_are_kept_and_verification_is_cheap():
    policy = CostAwareK(k_max=8, verify_curve=FLAT)
    for _ in range(10):
        policy.update(8, 8, draft_s=0.0001, verify_s=0.03)
    assert policy.next_k() == 8


def test_cost_policy_stops_drafting_a_draft_that_never_lands():
    policy = CostAwareK(k_max=8, verify_curve=FLAT, probe_every=1000)
    for _ in range(10):
        policy.update(4, 0, draft_s=0.03, verify_s=0.035)
    assert policy.next_k() == 0


def test_cost_policy_probes_after_idling():
    policy = CostAwareK(k_max=4, verify_curve=FLAT, probe_every=3)
    for _ in range(10):
        policy.update(4, 0, draft_s=0.03, verify_s=0.035)
    picks = [policy.next_k() for _ in range(3)]
    assert picks == [0, 0, 1]


def test_cost_policy_prefers_no_drafting_when_verification_is_expensive():
    steep = (1.0, 2.0, 3.0, 4.0, 5.0)
    policy = CostAwareK(k_max=4, verify_curve=steep, probe_every=1000)
    for _ in range(10):
        policy.update(2, 1, draft_s=0.0001, verify_s=0.1)
    assert policy.next_k() == 0


def test_a_profiled_draft_cost_replaces_the_clock():
    # The same accepted drafts, timed as a cheap draft by one policy and as a dear one by
    # the other: with one profiled cost both choose the same k, whatever the clock said.
    cheap = CostAwareK(k_max=8, verify_curve=FLAT, draft_cost=0.05, probe_every=1000)
    dear = CostAwareK(k_max=8, verify_curve=FLAT, probe_every=1000)
    dear.use_profiled_draft_cost(0.05)
    for _ in range(10):
        cheap.update(4, 2, draft_s=0.0001, verify_s=0.03)
        dear.update(4, 2, draft_s=0.3, verify_s=0.03)
    assert cheap.draft_cost() == dear.draft_cost() == 0.05
    assert cheap.next_k() == dear.next_k() > 0
    unprofiled = CostAwareK(k_max=8, verify_curve=FLAT, probe_every=1000)
    for _ in range(10):
        unprofiled.update(4, 2, draft_s=0.3, verify_s=0.03)
    assert unprofiled.next_k() == 0  # the clock alone: a draft that dear never pays
    with pytest.raises(BadInputError, match="draft_cost must be a number >= 0, got -1"):
        CostAwareK(draft_cost=-1)


def test_cost_policy_curve_is_made_non_decreasing():
    policy = CostAwareK(k_max=4, verify_curve=(2.0, 4.0, 3.0))
    assert policy.verify_curve == (1.0, 2.0, 2.0)
    assert policy.curve(5) > policy.curve(3)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"k_max": 0}, "k_max must be between"),
        ({"verify_curve": ()}, "verify_curve"),
        ({"prior_accept": 1.0}, "prior_accept"),
        ({"decay": 0.0}, "decay"),
    ],
)
def test_cost_policy_rejects_bad_settings(kwargs, fragment):
    with pytest.raises(BadInputError, match=fragment):
        CostAwareK(**kwargs)


def test_make_policy():
    assert isinstance(make_policy("fixed", 3), FixedK)
    assert isinstance(make_policy("adaptive", 3), AdaptiveK)
    assert isinstance(make_policy("cost", 3, verify_curve=FLAT), CostAwareK)
    with pytest.raises(BadInputError, match="unknown policy 'greedy'"):
        make_policy("greedy", 3)


def test_policy_names_are_declared_once():
    assert POLICIES == get_args(PolicyName) == ("fixed", "adaptive", "cost")
    for name in POLICIES:
        assert check_policy(name) == name
        assert make_policy(name, 3, verify_curve=FLAT).describe()["name"] == name


@pytest.mark.parametrize("name", ["greedy", "Cost", "", None, 1])
def test_check_policy_names_the_bad_value_and_the_choices(name):
    with pytest.raises(BadInputError) as raised:
        check_policy(name)
    assert str(raised.value) == f"unknown policy {name!r}; choose one of {POLICIES}"


def test_every_config_and_request_field_of_a_policy_is_the_one_literal():
    from pydantic import ValidationError

    from serving.server.config import ChampionConfig
    from serving.server.schemas import SpecOpsFields
    from tasks.data.params import CollectParams
    from tasks.loop.retrain_config import FamilySettings

    fields = {
        ChampionConfig: "policy",
        SpecOpsFields: "draft_policy",
        CollectParams: "policy",
        FamilySettings: "policy",
    }
    for model, field in fields.items():
        annotation = model.model_fields[field].annotation
        assert annotation == PolicyName or annotation == PolicyName | None, (model, field)
    assert ChampionConfig(policy="adaptive").policy == "adaptive"
    with pytest.raises(ValidationError, match="'fixed', 'adaptive' or 'cost'"):
        ChampionConfig(policy="greedy")
