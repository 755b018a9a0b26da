"""Per-draft-token features: target statistics, proposal features, and what the engine's
detailed records keep."""

from __future__ import annotations

import math

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftProposal
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.features import CONTEXT_WINDOW, ContextStats, target_statistics, token_features
from serving.engine.policy import FixedK


def test_target_statistics_are_entropy_and_log_probability():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    entropy, logprob = target_statistics(logits, [1, 0])
    assert entropy[0] == pytest.approx(math.log(2))
    assert logprob == pytest.approx([math.log(0.5), math.log(0.75)])


def test_context_stats_average_the_last_window():
    stats = ContextStats(prompt_tokens=10)
    stats.observe([1.0] * CONTEXT_WINDOW, [-1.0] * CONTEXT_WINDOW, CONTEXT_WINDOW)
    stats.observe([3.0] * 8, [-2.0] * 8, 8)
    assert stats.target_entropy == pytest.approx((24 * 1 + 8 * 3) / 32)
    assert stats.recent_logprob == pytest.approx((24 * -1 + 8 * -2) / 32)
    assert stats.length_ratio == pytest.approx(4.0)


def test_token_features_from_a_model_proposal_and_an_ngram_proposal():
    stats = ContextStats(prompt_tokens=4)
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]])
    model = token_features(
        DraftProposal(torch.tensor([0, 2]), draft_probs=probs), stats, stage="model"
    )
    assert [f.draft_confidence for f in model] == pytest.approx([0.5, 0.8])
    assert model[0].draft_entropy == pytest.approx(math.log(2))
    assert [f.position for f in model] == [0, 1] and model[0].match_len is None
    ngram = token_features(
        DraftProposal(
            torch.tensor([7, 8]),
            confidence=torch.tensor([1.0, 0.5]),
            match_len=torch.tensor([3, 2]),
        ),
        stats,
        stage="ngram",
        stage_index=2,
    )
    assert [f.match_len for f in ngram] == [3, 2]
    assert ngram[1].draft_entropy is None and ngram[1].stage_index == 2


def test_prompt_lookup_reports_its_matched_length():
    drafter = PromptLookupDrafter(max_ngram=3)
    drafter.begin([1, 2, 3, 4, 5, 1, 2, 3])
    from serving.engine.drafters.base import DraftRequest
    from serving.engine.sampling import SamplingParams, make_sampler

    proposal = drafter.propose(
        DraftRequest([1, 2, 3, 4, 5, 1, 2, 3], 2, make_sampler(SamplingParams()))
    )
    assert proposal.tokens.tolist() == [4, 5]
    assert proposal.match_len.tolist() == [3, 3]


def test_detailed_records_hold_one_row_per_ruled_draft(loaded, prompt):
    decoder = SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(2), policy=FixedK(4))
    result = decoder.generate(prompt * 3, max_new_tokens=40, mode="detailed")
    record = result.record
    assert record is not None and record.drafted
    per_step: dict[int, list] = {}
    for row in record.drafted:
        per_step.setdefault(row.step, []).append(row)
    for index, rows in per_step.items():
        proposed, accepted = record.steps[index]
        assert len(rows) == min(proposed, accepted + 1)
        assert [r.accepted for r in rows] == [i < accepted for i in range(len(rows))]
        assert [r.position for r in rows] == list(range(len(rows)))
    assert all(r.stage == "pld" and r.match_len is not None for r in record.drafted)
    assert all(r.target_entropy >= 0 and r.recent_logprob <= 0 for r in record.drafted)
    assert len(record.drafted) <= record.draft_tokens
