"""Drafting cost, profiled: each drafting step's time per drafted token over the one-token
pass its own verification implies, the median over steps."""

from __future__ import annotations

import pytest

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.metrics import StepRecord
from serving.engine.policy import CostAwareK, FixedK
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget
from tasks.evaluate.costs import fix_draft_cost, profile_draft_cost, step_ratios

CURVE = [1.0, 1.5, 2.0, 2.0]


def test_a_step_is_priced_against_its_own_verification():
    steps = [
        StepRecord(proposed=1, accepted=1, emitted=2, draft_s=0.003, verify_s=0.015),
        StepRecord(proposed=3, accepted=0, emitted=1, draft_s=0.006, verify_s=0.020),
        StepRecord(proposed=0, accepted=0, emitted=1, draft_s=0.0, verify_s=0.010),  # no draft
        StepRecord(proposed=2, accepted=2, emitted=3, draft_s=0.0, verify_s=0.020),  # untimed
    ]
    # (0.003 / 1) / (0.015 / 1.5) and (0.006 / 3) / (0.020 / 2.0)
    assert step_ratios(steps, CURVE) == pytest.approx([0.3, 0.2])


def test_the_profile_sets_the_policy_aside_and_a_repetitive_text_drafts():
    target = LoadedTarget.of(tiny_llama(num_layers=2))
    policy = CostAwareK(k_max=4, verify_curve=tuple(CURVE))
    decoder = SpeculativeDecoder(target, drafter=PromptLookupDrafter(), policy=policy)
    prompts = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [1, 2, 1, 2, 1, 2, 1, 2]]
    cost, steps = profile_draft_cost(decoder, prompts, curve=CURVE, k=4, max_new_tokens=24)
    assert steps > 0 and cost is not None and 0 <= cost < 1  # a lookup: far below one pass
    assert decoder.policy is policy and policy.profiled_draft_cost is None
    assert fix_draft_cost(decoder, cost) and policy.draft_cost() == cost
    plain = SpeculativeDecoder(target)
    assert profile_draft_cost(plain, prompts, curve=CURVE, k=4) == (None, 0)
    assert not fix_draft_cost(SpeculativeDecoder(target, drafter=PromptLookupDrafter(),
                                                 policy=FixedK(2)), 0.1)  # fmt: skip


def test_the_profile_stops_once_it_has_enough_steps():
    target = LoadedTarget.of(tiny_llama(num_layers=2))
    decoder = SpeculativeDecoder(target, drafter=PromptLookupDrafter(), policy=FixedK(4))
    prompts = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4]] * 50
    calls = []
    generate = decoder.generate
    decoder.generate = lambda *a, **k: calls.append(1) or generate(*a, **k)  # type: ignore[method-assign]
    _, steps = profile_draft_cost(decoder, prompts, curve=CURVE, k=4, enough=3)
    assert steps >= 3 and len(calls) < 50
