import json

import pytest

from serving.engine.metrics import StepRecord, acceptance_by_position, pool, summarize

STEPS = [
    StepRecord(proposed=4, accepted=2, emitted=3, draft_s=0.10, verify_s=0.20),
    StepRecord(proposed=4, accepted=4, emitted=5, draft_s=0.10, verify_s=0.25),
    StepRecord(proposed=2, accepted=0, emitted=1, draft_s=0.05, verify_s=0.15),
    StepRecord(proposed=0, accepted=0, emitted=1, draft_s=0.00, verify_s=0.10),
]


def test_summarize_formulas():
    stats = summarize(STEPS, prompt_tokens=12, prefill_s=0.3, total_s=2.0)
    assert stats.prompt_tokens == 12
    assert stats.generated_tokens == 10  # 3 + 5 + 1 + 1
    assert stats.checks == 4
    assert stats.draft_tokens == 10
    assert stats.accepted_tokens == 6
    assert stats.acceptance_rate == pytest.approx(0.6)
    assert stats.mean_accepted_length == pytest.approx(2.5)  # 10 tokens / 4 target passes
    assert stats.draft_s == pytest.approx(0.25)
    assert stats.verify_s == pytest.approx(0.70)
    assert stats.prefill_s == 0.3 and stats.total_s == 2.0
    assert stats.tokens_per_s == pytest.approx(5.0)
    assert json.loads(json.dumps(stats.to_dict()))["acceptance_by_position"] == [
        pytest.approx(2 / 3),
        pytest.approx(2 / 3),
        0.5,
        0.5,
    ]


def test_mean_accepted_length_is_one_plus_accepted_per_check_without_cuts():
    steps = [StepRecord(3, a, a + 1, 0.0, 0.0) for a in (0, 1, 3, 2)]
    stats = summarize(steps, prompt_tokens=1, prefill_s=0.0, total_s=1.0)
    assert stats.mean_accepted_length == pytest.approx(1 + stats.accepted_tokens / stats.checks)


def test_acceptance_by_position():
    # Position i counts only the checks that proposed at least i + 1 drafts.
    assert acceptance_by_position(STEPS) == [
        pytest.approx(2 / 3),  # kept by steps 1 and 2, not 3
        pytest.approx(2 / 3),
        0.5,  # reached by steps 1 and 2 only, kept by 2
        0.5,
    ]
    assert acceptance_by_position([StepRecord(1, 1, 2, 0, 0), StepRecord(3, 0, 1, 0, 0)]) == [
        0.5,
        0.0,
        0.0,
    ]
    assert acceptance_by_position([]) == []
    assert acceptance_by_position([StepRecord(0, 0, 1, 0, 0)]) == []


def test_plain_decoding_and_empty_requests():
    plain = summarize([StepRecord(0, 0, 1, 0.0, 0.1)] * 5, prompt_tokens=3, prefill_s=0, total_s=1)
    assert plain.acceptance_rate is None  # nothing drafted: no rate, not 0
    assert plain.mean_accepted_length == 1.0
    assert plain.acceptance_by_position == []
    empty = summarize([], prompt_tokens=3, prefill_s=0.0, total_s=0.0)
    assert empty.checks == 0 and empty.generated_tokens == 0
    assert empty.acceptance_rate is None
    assert empty.mean_accepted_length is None
    assert empty.tokens_per_s is None


def test_pool_sums_counts_instead_of_averaging_ratios():
    busy = summarize(
        [StepRecord(8, 8, 9, 0.0, 0.1)] * 10, prompt_tokens=5, prefill_s=0.0, total_s=3.0
    )
    idle = summarize([StepRecord(4, 0, 1, 0.0, 0.1)], prompt_tokens=5, prefill_s=0.0, total_s=1.0)
    pooled = pool([busy, idle])
    assert pooled == {
        "requests": 2,
        "generated_tokens": 91,
        "checks": 11,
        "draft_tokens": 84,
        "accepted_tokens": 80,
        "acceptance_rate": pytest.approx(80 / 84),  # the mean of ratios would be 0.5
        "mean_accepted_length": pytest.approx(91 / 11),
        "total_s": pytest.approx(4.0),
        "tokens_per_s": pytest.approx(91 / 4.0),
    }
    assert pool([]) == {
        "requests": 0,
        "generated_tokens": 0,
        "checks": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
        "acceptance_rate": None,
        "mean_accepted_length": None,
        "total_s": 0,
        "tokens_per_s": None,
    }


def test_accepted_drafts_are_summed_by_the_stage_that_drafted_them():
    steps = [
        StepRecord(4, 3, 4, 0.0, 0.0, "pld"),
        StepRecord(4, 1, 2, 0.0, 0.0, "head"),
        StepRecord(2, 2, 3, 0.0, 0.0, "pld"),
        StepRecord(0, 0, 1, 0.0, 0.0),  # drafted nothing: no stage
        StepRecord(3, 0, 1, 0.0, 0.0, "head"),
    ]
    stats = summarize(steps, prompt_tokens=1, prefill_s=0.0, total_s=1.0)
    assert stats.accepted_by_stage == {"pld": 5, "head": 1}
    assert summarize(STEPS, prompt_tokens=1, prefill_s=0.0, total_s=1.0).accepted_by_stage == {}
