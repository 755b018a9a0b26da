"""The record schema: a real engine record survives JSON unchanged; ids and failure flags."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from pydantic import ValidationError

from serving.records.schema import (
    SCHEMA_VERSION,
    RequestRecord,
    from_detailed,
    is_failure,
    record_id,
)
from serving.sampling import SamplingParams

NOW = 1_750_000_000.0


@pytest.fixture(scope="module")
def detailed(target, prompt):
    """A detailed-mode record from the tiny target with prompt lookup (it has rejections)."""
    from serving.drafters.prompt_lookup import PromptLookupDrafter
    from serving.engine import SpeculativeDecoder
    from serving.policy import FixedK

    decoder = SpeculativeDecoder(target, drafter=PromptLookupDrafter(), policy=FixedK(4))
    result = decoder.generate(
        prompt, max_new_tokens=24, sampling=SamplingParams(seed=7), mode="detailed"
    )
    assert result.record is not None
    assert result.record.disagreements, "the round trip should cover nested disagreements"
    return result.record


def _build(detailed, **overrides) -> dict:
    values = dict(
        record_key="req-1",
        prompt_id="grounded:p1",
        workload="grounded",
        split="train",
        prompt="Repeat after me.",
        output_text="whatever the tokenizer said",
        drafter_version="v3",
        hardware="cpu",
        run_id="run-1",
        failure_threshold=0.5,
        timestamp=NOW,
    )
    values.update(overrides)
    return from_detailed(detailed, **values)


def test_engine_record_round_trips_through_json(detailed):
    row = _build(detailed)
    text = json.dumps(row)
    parsed = RequestRecord.model_validate(json.loads(text))
    assert parsed.model_dump(mode="json") == row
    assert RequestRecord.model_validate_json(text).model_dump(mode="json") == row


def test_record_carries_the_engine_fields_and_the_collection_context(detailed):
    row = _build(detailed)
    assert row["schema_version"] == SCHEMA_VERSION
    assert row["id"] == "req-1"
    assert row["prompt_token_ids"] == detailed.prompt_token_ids
    assert row["output_token_ids"] == detailed.output_token_ids
    assert row["from_draft"] == detailed.from_draft
    assert row["steps"] == detailed.steps
    assert row["checks"] == detailed.checks == len(row["steps"])
    assert row["draft_tokens"] == detailed.draft_tokens == sum(p for p, _ in row["steps"])
    assert row["accepted_tokens"] == detailed.accepted_tokens == sum(a for _, a in row["steps"])
    assert row["acceptance_rate"] == detailed.acceptance_rate
    assert row["drafter"] == detailed.drafter["name"]
    assert row["policy"] == "fixed"
    assert row["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 7}
    assert row["disagreements"] == [dataclasses.asdict(d) for d in detailed.disagreements]
    assert row["timestamp"] == NOW
    assert (row["drafter_version"], row["hardware"], row["run_id"]) == ("v3", "cpu", "run-1")
    assert row["is_failure"] == is_failure(detailed.acceptance_rate, 0.5)


def test_timestamp_defaults_to_now(detailed):
    import time

    before = time.time()
    row = _build(detailed, timestamp=None)
    assert before <= row["timestamp"] <= time.time()


def test_failure_flag_follows_the_threshold(detailed):
    rate = detailed.acceptance_rate
    assert rate is not None and 0.0 < rate < 1.0
    assert _build(detailed, failure_threshold=1.0)["is_failure"] is True
    assert _build(detailed, failure_threshold=rate)["is_failure"] is False
    assert _build(detailed, failure_threshold=0.0)["is_failure"] is False


def test_non_finite_engine_values_are_refused(detailed):
    broken = dataclasses.replace(detailed, acceptance_rate=math.nan)
    with pytest.raises(ValidationError, match="acceptance_rate"):
        _build(broken)


def test_extra_fields_are_refused(detailed):
    row = {**_build(detailed), "note": "hi"}
    with pytest.raises(ValidationError, match="note"):
        RequestRecord.model_validate(row)


# ------------------------------------------------------------------------------ record_id

PARTS = ("run-1", "grounded:p1", "pld(n=1..3)", "builtin", "cpu", SamplingParams(seed=1))


def test_record_id_is_deterministic_and_short():
    first = record_id(*PARTS)
    assert first == record_id(*PARTS)
    assert len(first) == 32 and all(c in "0123456789abcdef" for c in first)


@pytest.mark.parametrize(
    "index, replacement",
    [
        (0, "run-2"),
        (1, "grounded:p2"),
        (2, "pld(n=1..4)"),
        (3, "v2"),
        (4, "cpu-stock"),
        (5, SamplingParams(seed=2)),
        (5, SamplingParams(temperature=0.7, seed=1)),
    ],
)
def test_record_id_changes_with_each_part(index, replacement):
    parts = list(PARTS)
    parts[index] = replacement
    assert record_id(*parts) != record_id(*PARTS)


def test_record_id_keeps_part_boundaries():
    assert record_id("ab", "c") != record_id("a", "bc")
    assert record_id("a", "b") != record_id("b", "a")
    assert record_id("a,b") != record_id("a", "b")


# ------------------------------------------------------------------------------ is_failure


@pytest.mark.parametrize(
    "rate, threshold, expected",
    [
        (None, 0.5, False),  # nothing drafted: no evidence, not a failure
        (None, 1.0, False),
        (0.0, 0.5, True),
        (0.49, 0.5, True),
        (0.5, 0.5, False),  # at the threshold is not below it
        (0.9, 0.5, False),
        (0.0, 0.0, False),  # a zero threshold never flags
        (0.99, 1.0, True),
        (1.0, 1.0, False),
    ],
)
def test_is_failure(rate, threshold, expected):
    assert is_failure(rate, threshold) is expected
