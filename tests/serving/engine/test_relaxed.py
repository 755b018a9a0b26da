"""Relaxed verification: λ = ∞ is exactly lossless; a small λ keeps disagreeing drafts and
says which; bad λ and sampling are refused before any model work."""

from __future__ import annotations

import math

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.model import ModelDrafter
from serving.engine.policy import FixedK
from serving.engine.relaxed import check_lambda, verify_relaxed
from serving.engine.sampling import SamplingParams
from serving.errors import BadInputError
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget

NEW_TOKENS = 48


def _logits(choices: list[int], vocab: int = 8, runner_up: dict[int, int] | None = None):
    """Rows whose argmax is ``choices[i]``; ``runner_up[i]`` gets nearly as much mass."""
    rows = torch.full((len(choices), vocab), -10.0)
    for i, c in enumerate(choices):
        rows[i, c] = 5.0
        if runner_up and i in runner_up:
            rows[i, runner_up[i]] = 4.9
    return rows


def test_infinite_lambda_stops_at_the_first_disagreement():
    drafts = torch.tensor([1, 2, 3])
    logits = _logits([1, 5, 3, 4], runner_up={1: 2})
    relaxed = verify_relaxed(drafts, logits, lam=math.inf, tokens_per_pass=2.0)
    assert relaxed.verdict.accepted_len == 1 and relaxed.verdict.next_token == 5
    assert relaxed.unverified == ()


def test_a_near_tie_is_kept_when_lambda_is_small_and_refused_when_large():
    drafts = torch.tensor([1, 2, 3])
    logits = _logits([1, 5, 3, 4], runner_up={1: 2})  # draft 2 is a near tie with 5
    kept = verify_relaxed(drafts, logits, lam=1.0, tokens_per_pass=2.0)
    assert kept.verdict.accepted_len == 3 and kept.verdict.next_token == 4
    assert kept.unverified == (1,)
    refused = verify_relaxed(drafts, logits, lam=100.0, tokens_per_pass=2.0)
    assert refused.verdict.accepted_len == 1 and refused.unverified == ()


def test_a_clear_disagreement_needs_a_tiny_lambda():
    drafts = torch.tensor([2])
    logits = _logits([5, 4])  # the draft has almost no mass under the target
    # a 15-nat gap: kept only when λ * 15 < 1 (one token gained per pass)
    assert verify_relaxed(drafts, logits, lam=0.1, tokens_per_pass=1.0).unverified == ()
    assert verify_relaxed(drafts, logits, lam=0.05, tokens_per_pass=1.0).unverified == (0,)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "fast", True, [1]])
def test_bad_lambda_is_refused(value):
    with pytest.raises(BadInputError, match="λ"):
        check_lambda(value)


def test_lambda_inf_spellings_mean_lossless():
    assert check_lambda(None) == check_lambda("inf") == check_lambda(math.inf) == math.inf


def _decoder(target: LoadedTarget, lam):
    drafter = ModelDrafter(LoadedTarget.of(tiny_llama(seed=1)))
    return SpeculativeDecoder(target, drafter=drafter, policy=FixedK(4), relax_lambda=lam)


def test_engine_with_infinite_lambda_is_exactly_lossless(loaded, prompt, greedy_reference):
    result = _decoder(loaded, math.inf).generate(prompt, max_new_tokens=NEW_TOKENS)
    assert result.token_ids == greedy_reference


def test_engine_relaxed_reports_unverified_tokens(loaded, prompt, greedy_reference):
    generation = _decoder(loaded, 0.001).stream(prompt, max_new_tokens=NEW_TOKENS, mode="detailed")
    events = list(generation)
    result = generation.result
    unverified = [i for i, e in enumerate(events) if not e.verified]
    assert unverified, "a tiny λ kept no disagreeing draft"
    assert result.token_ids != greedy_reference
    assert result.record.unverified == unverified
    assert all(result.from_draft[i] for i in unverified)
    rows = [r for r in result.record.drafted if r.kept and not r.accepted]
    assert len(rows) == len(unverified)


def test_relaxed_mode_refuses_sampling(loaded, prompt):
    with pytest.raises(BadInputError, match="greedy"):
        _decoder(loaded, 1.0).stream(prompt, sampling=SamplingParams(temperature=0.8))
