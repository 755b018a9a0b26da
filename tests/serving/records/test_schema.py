"""The record schema: a real engine record survives JSON unchanged, drafted tokens included;
records written before (committed under fixtures/) read and write back byte for byte; the
engine's own dataclasses are the nested rows, held to the record's rules; an old (version 1)
record is read as the current version; ids and failure flags."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from serving.engine.detailed import Disagreement
from serving.engine.features import DraftedToken
from serving.engine.sampling import SamplingParams
from serving.errors import BadInputError
from serving.records.schema import (
    SCHEMA_VERSION,
    RequestRecord,
    UnknownSchemaVersionError,
    from_detailed,
    is_failure,
    migrate_record,
    parse_record,
    record_id,
)

NOW = 1_750_000_000.0
# Records main's code wrote (schema version 2) before the record's nested rows became the
# engine's dataclasses: prompt lookup, a relaxed layers:1 draft (confidence, entropy,
# unverified positions), a sampled n-gram drafter, and plain decoding.
FIXTURE = Path(__file__).parent / "fixtures" / "records-v2.jsonl"


@pytest.fixture(scope="module")
def detailed(loaded, prompt):
    """A detailed-mode record from the tiny target with prompt lookup (it has rejections)."""
    from serving.engine.decoder import SpeculativeDecoder
    from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
    from serving.engine.policy import FixedK

    decoder = SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(), policy=FixedK(4))
    result = decoder.generate(
        prompt, max_new_tokens=24, sampling=SamplingParams(seed=7), mode="detailed"
    )
    assert result.record is not None
    assert result.record.disagreements, "the round trip should cover nested disagreements"
    assert result.record.drafted, "... and drafted tokens"
    return result.record


@pytest.fixture(scope="module")
def relaxed(loaded, prompt):
    """A relaxed-verification record with a model draft: drafts kept unverified, and the
    draft's confidence and entropy on every drafted token."""
    from serving.engine.decoder import SpeculativeDecoder
    from serving.engine.drafters.model import ModelDrafter
    from serving.engine.policy import FixedK
    from serving.models.truncated import first_layers

    decoder = SpeculativeDecoder(
        loaded,
        drafter=ModelDrafter(loaded.over(first_layers(loaded.model, 1))),
        policy=FixedK(4),
        relax_lambda=0.05,
    )
    result = decoder.generate(
        prompt, max_new_tokens=24, sampling=SamplingParams(seed=7), mode="detailed"
    )
    assert result.record is not None and result.record.unverified
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


def test_drafted_row_has_exactly_the_engine_fields(detailed):
    """The record's nested rows are the engine's dataclasses: one declaration, no copy to
    keep equal."""
    row = _build(detailed)
    parsed = parse_record(json.loads(json.dumps(row)))
    assert parsed.drafted and all(type(d) is DraftedToken for d in parsed.drafted)
    assert parsed.disagreements and all(type(d) is Disagreement for d in parsed.disagreements)
    assert parsed.drafted == detailed.drafted
    assert parsed.disagreements == detailed.disagreements
    assert [list(d) for d in row["drafted"]] == [
        [f.name for f in dataclasses.fields(DraftedToken)]
    ] * len(row["drafted"])


def test_drafted_tokens_are_recorded_and_consistent(detailed):
    row = _build(detailed)
    assert SCHEMA_VERSION == 3
    assert row["drafted"] == [d.to_dict() for d in detailed.drafted]
    assert row["unverified"] == [] == detailed.unverified  # exact verification
    drafted = row["drafted"]
    assert 0 < len(drafted) <= row["draft_tokens"]
    # One row per draft the target ruled on: up to and including a block's first rejection.
    for step, (proposed, accepted) in enumerate(row["steps"]):
        rows = [d for d in drafted if d["step"] == step]
        assert len(rows) == min(proposed, accepted + 1)
        assert [d["position"] for d in rows] == list(range(len(rows)))
        assert [d["accepted"] for d in rows] == [i < accepted for i in range(len(rows))]
    for d in drafted:
        assert 0 <= d["step"] < row["checks"]
        assert d["kept"] == d["accepted"]
        assert (d["stage"], d["stage_index"]) == ("pld", 0)
        assert d["match_len"] >= 1 and d["draft_entropy"] is None
        assert d["target_entropy"] >= 0 and d["recent_logprob"] <= 0 and d["length_ratio"] >= 0
    assert sum(d["accepted"] for d in drafted) == row["accepted_tokens"]


def test_relaxed_record_keeps_its_unverified_positions(relaxed):
    row = _build(relaxed)
    assert RequestRecord.model_validate(json.loads(json.dumps(row))).model_dump() == row
    assert row["unverified"] == relaxed.unverified
    assert all(row["from_draft"][p] for p in row["unverified"])
    drafted = row["drafted"]
    assert sum(d["kept"] for d in drafted) == row["accepted_tokens"]
    assert any(d["kept"] and not d["accepted"] for d in drafted)
    assert not any(d["accepted"] and not d["kept"] for d in drafted)
    for d in drafted:
        assert d["stage"] == "model" and d["match_len"] is None
        assert 0 <= d["draft_confidence"] <= 1 and d["draft_entropy"] >= 0


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


# --------------------------------------------------------- records written before, nested rows


def _fixture_lines() -> list[str]:
    return FIXTURE.read_text().splitlines()


def test_records_written_before_read_and_write_back_byte_for_byte():
    lines = _fixture_lines()
    assert len(lines) == 4
    for line in lines:  # version 2, read as version 3: nothing else changes
        current = {**json.loads(line), "schema_version": 3, "masked_disagreements": 0}
        assert parse_record(json.loads(line)).model_dump(mode="json") == current
        assert json.dumps(parse_record(current).model_dump(mode="json")) == json.dumps(current)
        assert RequestRecord.model_validate_json(json.dumps(current)).model_dump_json() == (
            RequestRecord.model_validate(current).model_dump_json()
        )
    rows = [json.loads(line) for line in lines]
    assert any(r["disagreements"] for r in rows) and any(r["unverified"] for r in rows)
    assert any(d["draft_entropy"] is not None for r in rows for d in r["drafted"])


def test_the_engine_writes_the_fields_of_records_written_before(detailed, relaxed):
    """Names and order, at every level (the values depend on the CPU's arithmetic)."""
    before = json.loads(_fixture_lines()[0])
    for record in (detailed, relaxed):
        row = _build(record)
        assert list(row) == [*before, "masked_disagreements"]  # version 3 added it
        assert list(row["sampling"]) == list(before["sampling"])
        assert {tuple(d) for d in row["disagreements"]} == {tuple(before["disagreements"][0])}
        assert {tuple(d) for d in row["drafted"]} == {tuple(before["drafted"][0])}


def _first_nested(key: str) -> tuple[dict, dict]:
    row = json.loads(_fixture_lines()[0])
    return row, row[key][0]


@pytest.mark.parametrize(
    "key, field, value",
    [
        ("drafted", "step", "1"),  # no coercion from strings
        ("drafted", "token", 7.0),  # nor from floats to integers
        ("drafted", "accepted", 1),  # nor from integers to booleans
        ("drafted", "stage_index", True),  # nor from booleans to integers
        ("drafted", "target_entropy", math.nan),  # no NaN
        ("drafted", "draft_confidence", math.inf),  # nor infinity
        ("drafted", "kept", None),  # a required field is not nullable
        ("disagreements", "target_prob_of_draft", -math.inf),
        ("disagreements", "context", "1, 2"),
        ("disagreements", "position", "3"),
    ],
)
def test_nested_rows_are_as_strict_as_the_record(key, field, value):
    row, nested = _first_nested(key)
    nested[field] = value
    with pytest.raises(ValidationError, match=rf"{key}\.0\.{field}"):
        parse_record(row)


@pytest.mark.parametrize("key", ["drafted", "disagreements"])
def test_nested_rows_refuse_extra_and_missing_fields(key):
    row, nested = _first_nested(key)
    nested["note"] = "hi"
    with pytest.raises(ValidationError, match=rf"{key}\.0\.note"):
        parse_record(row)
    row, nested = _first_nested(key)
    del nested["position"]
    with pytest.raises(ValidationError, match=rf"{key}\.0\.position"):
        parse_record(row)
    row, _ = _first_nested(key)
    row[key][0] = [1, 2, 3]  # not an object
    with pytest.raises(ValidationError, match=rf"{key}\.0"):
        parse_record(row)


def test_non_finite_engine_rows_are_refused(detailed):
    """The engine's own instances are checked again when a record is built from them."""
    drafted = [dataclasses.replace(detailed.drafted[0], target_entropy=math.nan)]
    with pytest.raises(ValidationError, match=r"drafted\.0\.target_entropy"):
        _build(dataclasses.replace(detailed, drafted=drafted))
    disagreements = [dataclasses.replace(detailed.disagreements[0], draft_prob_of_draft=math.inf)]
    with pytest.raises(ValidationError, match=r"disagreements\.0\.draft_prob_of_draft"):
        _build(dataclasses.replace(detailed, disagreements=disagreements))


# ------------------------------------------------------------------------------ old versions

# A version-1 record as a store written before per-token features holds it (one JSONL line).
V1_LINE = (
    '{"schema_version": 1, "id": "0f3c2a", "prompt_id": "grounded:p1", "workload": "grounded", '
    '"split": "train", "prompt": "Repeat after me.", "prompt_token_ids": [1, 5, 17], '
    '"output_text": "abcd", "output_token_ids": [5, 17, 9, 2], '
    '"from_draft": [true, false, false, false], "acceptance_rate": 0.25, '
    '"mean_accepted_length": 1.3333333333333333, "draft_tokens": 4, "accepted_tokens": 1, '
    '"checks": 3, "steps": [[4, 1], [0, 0], [0, 0]], "is_failure": true, '
    '"failure_threshold": 0.5, "drafter": "pld(n=1..3)", "drafter_version": "builtin", '
    '"policy": "fixed", "hardware": "cpu", '
    '"sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 7}, '
    '"timestamp": 1749990000.0, "run_id": "run-1", "disagreements": [{"position": 1, '
    '"draft_index": 1, "draft_token": 42, "target_token": 17, "target_prob_of_draft": 0.01, '
    '"target_prob_of_target": 0.6, "draft_prob_of_draft": 1.0, "draft_prob_of_target": 0.0, '
    '"context": [1, 5, 17, 5]}]}'
)


def test_a_version_1_record_is_read_as_the_current_version():
    old = json.loads(V1_LINE)
    before = json.dumps(old)
    record = parse_record(old)
    assert json.dumps(old) == before  # the raw row is left as it was
    assert record.schema_version == SCHEMA_VERSION
    assert (record.drafted, record.unverified) == ([], [])  # never recorded in version 1
    current = record.model_dump(mode="json")
    assert current["masked_disagreements"] == 0  # nothing was removed by redaction then
    added = ("drafted", "unverified", "masked_disagreements")
    assert {k: v for k, v in current.items() if k not in added} == {
        **old,
        "schema_version": SCHEMA_VERSION,
    }
    assert migrate_record(old) == current
    assert parse_record(current).model_dump(mode="json") == current  # current: unchanged
    with pytest.raises(ValidationError, match="schema_version"):
        RequestRecord.model_validate(old)  # only the reader knows old versions


def test_a_version_2_record_gains_no_masked_disagreements():
    old = {**json.loads(V1_LINE), "schema_version": 2, "drafted": [], "unverified": []}
    current = parse_record(old).model_dump(mode="json")
    assert current == {**old, "schema_version": SCHEMA_VERSION, "masked_disagreements": 0}
    negative = {**current, "masked_disagreements": -1}  # parses; validation refuses it
    assert parse_record(negative).masked_disagreements == -1


@pytest.mark.parametrize("version", [0, 4, 99, "1", 1.0, True, None])
def test_an_unknown_version_is_refused_naming_it(version):
    row = {**json.loads(V1_LINE), "schema_version": version}
    with pytest.raises(UnknownSchemaVersionError, match="it reads 1, 2, 3") as raised:
        parse_record(row)
    assert str(raised.value).startswith(f"schema_version: {version!r} is not a record version")
    assert isinstance(raised.value, BadInputError)


def test_a_record_without_a_version_is_refused_by_the_schema():
    row = json.loads(V1_LINE)
    del row["schema_version"]
    with pytest.raises(ValidationError, match="schema_version"):
        parse_record(row)
    with pytest.raises(ValidationError):
        parse_record([V1_LINE])  # not an object


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
