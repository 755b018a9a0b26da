"""Validation: parse, duplicate and Great Expectations stages; nothing dropped silently."""

from __future__ import annotations

import copy
import json
import math
from collections import Counter

import pytest

from serving.atomic import write_jsonl_atomic
from serving.engine.detailed import Disagreement
from serving.engine.features import DraftedToken
from serving.errors import BadInputError
from serving.records.schema import RequestRecord, Sampling
from serving.records.store import partition_dir, read_raw
from tasks.data.validate import (
    quarantine_path,
    summary_of_subset,
    validate_records,
    validate_store,
)
from tests.serving.records.test_schema import V1_LINE

NOW = 1_750_000_000.0
HARDWARE = ("cpu", "cuda")


def drafted_row(step: int, position: int, token: int, accepted: bool) -> DraftedToken:
    return DraftedToken(
        stage="pld",
        stage_index=0,
        position=position,
        draft_confidence=0.8 if position == 0 else None,
        draft_entropy=None,
        match_len=2,
        target_entropy=1.5,
        recent_logprob=-0.7,
        length_ratio=2 * step / 3,
        step=step,
        token=token,
        accepted=accepted,
        kept=accepted,
    )


def _json(records: list[RequestRecord]) -> list[dict]:
    """Parsed records as they are stored."""
    return [r.model_dump(mode="json") for r in records]


def make_record(index: int, **fields) -> dict:
    """A valid record: 4 output tokens from 2 checks, each proposing 2 drafts and keeping 1;
    the two rejections are the disagreements at output positions 1 and 3, and the four
    drafted tokens (kept, rejected; kept, rejected) are all drafted rows."""
    values = dict(
        id=f"req-{index}",
        schema_version=3,
        prompt_id=f"prompt-{index}",
        workload="sharegpt",
        split="train",
        prompt="Fix the grammar.",
        prompt_token_ids=[1, 2, 3],
        output_text="a b c d",
        output_token_ids=[10, 11, 12, 13],
        from_draft=[True, False, True, False],
        acceptance_rate=0.5,
        mean_accepted_length=2.0,
        draft_tokens=4,
        accepted_tokens=2,
        checks=2,
        steps=[[2, 1], [2, 1]],
        is_failure=False,
        failure_threshold=0.5,
        drafter="prompt_lookup",
        drafter_version="v1",
        policy="fixed",
        hardware="cpu",
        sampling=Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=None),
        timestamp=NOW - 3600.0,
        run_id="run-1",
        disagreements=[
            Disagreement(
                position=position,
                draft_index=1,
                draft_token=99,
                target_token=target,
                target_prob_of_draft=0.1,
                target_prob_of_target=0.7,
                draft_prob_of_draft=0.6,
                draft_prob_of_target=0.2,
                context=[1, 2, 3, 10, 11, 12][: 3 + position],
            )
            for position, target in ((1, 11), (3, 13))
        ],
        drafted=[
            drafted_row(0, 0, 10, True),
            drafted_row(0, 1, 99, False),
            drafted_row(1, 0, 12, True),
            drafted_row(1, 1, 99, False),
        ],
        unverified=[],
    )
    values.update(fields)
    return RequestRecord(**values).model_dump(mode="json")


def nothing_drafted(index: int) -> dict:
    """Valid with null acceptance: no drafts, one token per check."""
    return make_record(
        index,
        from_draft=[False] * 4,
        acceptance_rate=None,
        mean_accepted_length=1.0,
        draft_tokens=0,
        accepted_tokens=0,
        checks=4,
        steps=[[0, 0]] * 4,
        disagreements=[],
        drafted=[],
    )


def changed(index: int, **fields) -> dict:
    """A valid record with raw (unvalidated) fields replaced."""
    return {**make_record(index), **fields}


def changed_disagreement(index: int, which: int, **fields) -> dict:
    record = make_record(index)
    record["disagreements"][which].update(fields)
    return record


def changed_drafted(index: int, which: int, **fields) -> dict:
    record = make_record(index)
    record["drafted"][which].update(fields)
    return record


def relaxed(index: int, unverified: list[int]) -> dict:
    """``make_record`` as relaxed verification would leave it with ``unverified`` kept."""
    return changed(index, unverified=unverified)


def without(index: int, field: str) -> dict:
    record = make_record(index)
    del record[field]
    return record


# name -> (raw row, stage, reasons that must be among the row's reasons)
BAD = {
    "missing field": (without(100, "prompt"), "parse", ["prompt: Field required"]),
    "wrong type": (changed(101, checks="2"), "parse", ["checks: Input should be a valid integer"]),
    "extra field": (
        changed(102, note="hi"),
        "parse",
        ["note: Extra inputs are not permitted"],
    ),
    "NaN": (
        changed(103, acceptance_rate=json.loads("NaN")),
        "parse",
        ["acceptance_rate: Input should be a finite number"],
    ),
    "nested inf": (
        changed_disagreement(104, 0, target_prob_of_draft=math.inf),
        "parse",
        ["disagreements.0.target_prob_of_draft: Input should be a finite number"],
    ),
    "not JSON": ('{"id": "req-105", "prompt', "parse", ["not JSON"]),
    "not an object": ([1, 2, 3], "parse", ["not a JSON object (got list)"]),
    "empty prompt_token_ids": (
        changed(106, prompt_token_ids=[]),
        "expectations",
        ["expect_column_values_to_be_between(prompt_token_count)"],
    ),
    "empty output_token_ids": (
        changed(107, output_token_ids=[], from_draft=[], disagreements=[]),
        "expectations",
        ["expect_column_values_to_be_between(output_token_count)"],
    ),
    "from_draft length": (
        changed(108, from_draft=[True, False, True]),
        "expectations",
        ["expect_column_pair_values_to_be_equal(from_draft_length,output_token_count)"],
    ),
    "acceptance_rate 1.5": (
        changed(109, acceptance_rate=1.5),
        "expectations",
        ["expect_column_values_to_be_between(acceptance_rate)"],
    ),
    "accepted > drafted": (
        changed(110, accepted_tokens=5),
        "expectations",
        ["expect_column_pair_values_a_to_be_greater_than_b(draft_tokens,accepted_tokens)"],
    ),
    "unknown hardware": (
        changed(111, hardware="tpu-v9"),
        "expectations",
        ["expect_column_values_to_be_in_set(hardware)"],
    ),
    "unknown workload": (
        changed(112, workload="poetry"),
        "expectations",
        ["expect_column_values_to_be_in_set(workload)"],
    ),
    "future timestamp": (
        changed(113, timestamp=NOW + 2 * 86_400.0),
        "expectations",
        ["expect_column_values_to_be_between(timestamp)"],
    ),
    "is_failure inconsistent": (
        changed(114, is_failure=True),
        "expectations",
        ["expect_column_pair_values_to_be_equal(is_failure,is_failure_expected)"],
    ),
    "steps disagree with checks": (
        changed(115, steps=[[2, 1]]),
        "expectations",
        ["expect_column_pair_values_to_be_equal(steps_count,checks)"],
    ),
    "unknown split": (
        changed(116, split="test"),
        "expectations",
        ["expect_column_values_to_be_in_set(split)"],
    ),
    "draft token == target token": (
        changed_disagreement(117, 1, draft_token=13),
        "expectations",
        ["disagreement 1: expect_column_values_to_be_in_set(draft_token_differs)"],
    ),
    "probability 1.2": (
        changed_disagreement(118, 0, draft_prob_of_draft=1.2),
        "expectations",
        ["disagreement 0: expect_column_values_to_be_between(draft_prob_of_draft)"],
    ),
    "empty context": (
        changed_disagreement(119, 0, context=[]),
        "expectations",
        ["disagreement 0: expect_column_values_to_be_between(context_length)"],
    ),
    "position past the output": (
        changed_disagreement(120, 1, position=4),
        "expectations",
        [
            "disagreement 1: "
            "expect_column_pair_values_a_to_be_greater_than_b(output_length,position)"
        ],
    ),
    "nested inf in drafted": (
        changed_drafted(121, 2, target_entropy=math.inf),
        "parse",
        ["drafted.2.target_entropy: Input should be a finite number"],
    ),
    "unknown schema version": (
        changed(122, schema_version=4),
        "parse",
        [
            "schema_version: 4 is not a record version this code reads (it reads 1, 2, 3): a "
            "newer specops wrote it, or the row is damaged; upgrade specops to read it"
        ],
    ),
    "more drafted rows than drafts": (
        changed(123, drafted=[*make_record(0)["drafted"], make_record(0)["drafted"][3]]),
        "expectations",
        ["expect_column_pair_values_a_to_be_greater_than_b(draft_tokens,drafted_count)"],
    ),
    "unverified past the output": (
        relaxed(124, [4]),
        "expectations",
        ["expect_column_pair_values_a_to_be_greater_than_b(output_token_count,unverified_max)"],
    ),
    "unverified not from a draft": (
        relaxed(125, [1]),
        "expectations",
        ["expect_column_values_to_be_in_set(unverified_from_draft)"],
    ),
    "unknown stage": (
        changed_drafted(126, 0, stage="oracle"),
        "expectations",
        ["drafted 0: expect_column_values_to_be_in_set(stage)"],
    ),
    "negative stage index": (
        changed_drafted(127, 1, stage_index=-1),
        "expectations",
        ["drafted 1: expect_column_values_to_be_between(stage_index)"],
    ),
    "negative drafted position": (
        changed_drafted(128, 2, position=-1),
        "expectations",
        ["drafted 2: expect_column_values_to_be_between(position)"],
    ),
    "negative step": (
        changed_drafted(129, 0, step=-1),
        "expectations",
        ["drafted 0: expect_column_values_to_be_between(step)"],
    ),
    "step past the checks": (
        changed_drafted(130, 3, step=2),
        "expectations",
        ["drafted 3: expect_column_pair_values_a_to_be_greater_than_b(checks,step)"],
    ),
    "draft confidence 1.5": (
        changed_drafted(131, 0, draft_confidence=1.5),
        "expectations",
        ["drafted 0: expect_column_values_to_be_between(draft_confidence)"],
    ),
    "negative draft entropy": (
        changed_drafted(132, 1, draft_entropy=-0.1),
        "expectations",
        ["drafted 1: expect_column_values_to_be_between(draft_entropy)"],
    ),
    "negative match length": (
        changed_drafted(133, 2, match_len=-1),
        "expectations",
        ["drafted 2: expect_column_values_to_be_between(match_len)"],
    ),
    "negative target entropy": (
        changed_drafted(134, 3, target_entropy=-0.5),
        "expectations",
        ["drafted 3: expect_column_values_to_be_between(target_entropy)"],
    ),
    "positive recent log-probability": (
        changed_drafted(135, 0, recent_logprob=0.3),
        "expectations",
        ["drafted 0: expect_column_values_to_be_between(recent_logprob)"],
    ),
    "negative length ratio": (
        changed_drafted(136, 1, length_ratio=-1.0),
        "expectations",
        ["drafted 1: expect_column_values_to_be_between(length_ratio)"],
    ),
    "accepted but not kept": (
        changed_drafted(137, 2, kept=False),
        "expectations",
        ["drafted 2: expect_column_values_to_be_in_set(kept_if_accepted)"],
    ),
    "negative masked disagreements": (
        changed(138, masked_disagreements=-1),
        "expectations",
        ["expect_column_values_to_be_between(masked_disagreements)"],
    ),
    "duplicate id": (
        make_record(0),
        "duplicate",
        ["duplicate id req-0 (first at good-0)"],
    ),
}

GOOD = [make_record(0), make_record(1), nothing_drafted(2), make_record(3)]


@pytest.fixture(scope="module")
def mixed():
    """Good rows interleaved with one bad row of each kind (the duplicate after its first)."""
    rows = []
    for index, record in enumerate(GOOD):
        rows.append((f"good-{index}", copy.deepcopy(record)))
    for name, (row, _, _) in BAD.items():
        rows.insert(2, (f"bad-{name}", copy.deepcopy(row)))
    rows.append(("good-last", make_record(4)))
    result = validate_records(rows, known_hardware=HARDWARE, now=NOW)
    return rows, result


@pytest.mark.parametrize("name", list(BAD))
def test_each_bad_row_is_quarantined_with_a_reason(mixed, name):
    _, result = mixed
    row, stage, reasons = BAD[name]
    [entry] = [e for e in result.quarantined if e["source"] == f"bad-{name}"]
    assert entry["stage"] == stage
    assert set(reasons) <= set(entry["reasons"]), entry["reasons"]
    assert json.dumps(entry["record"], allow_nan=True) == json.dumps(row, allow_nan=True)


def test_single_problem_gives_only_its_reason(mixed):
    _, result = mixed
    by_source = {e["source"]: e["reasons"] for e in result.quarantined}
    assert by_source["bad-acceptance_rate 1.5"] == [
        "expect_column_values_to_be_between(acceptance_rate)"
    ]
    assert by_source["bad-probability 1.2"] == [
        "disagreement 0: expect_column_values_to_be_between(draft_prob_of_draft)"
    ]
    assert by_source["bad-accepted but not kept"] == [
        "drafted 2: expect_column_values_to_be_in_set(kept_if_accepted)"
    ]
    assert by_source["bad-unverified not from a draft"] == [
        "expect_column_values_to_be_in_set(unverified_from_draft)"
    ]


def test_valid_rows_kept_in_order_and_every_row_accounted_for(mixed):
    rows, result = mixed
    assert _json(result.valid) == [*GOOD, make_record(4)]
    assert len(result.valid) + len(result.quarantined) == len(rows)
    assert [e["source"] for e in result.quarantined] == [
        source for source, _ in rows if source.startswith("bad-")
    ]
    summary = result.summary.model_dump(mode="json")
    assert summary["total"] == len(rows)
    assert (summary["valid"], summary["quarantined"]) == (5, len(BAD))
    stages = [stage for _, stage, _ in BAD.values()]
    assert summary["by_stage"] == {
        s: stages.count(s) for s in ("parse", "duplicate", "expectations")
    }
    assert summary["by_reason"]["duplicate id"] == 1
    assert summary["by_reason"]["not JSON"] == 1
    assert (
        summary["by_reason"][
            "disagreements.*.target_prob_of_draft: Input should be a finite number"
        ]
        == 1
    )
    assert (
        summary["by_reason"]["disagreement: expect_column_values_to_be_between(context_length)"]
        == 1
    )
    requests = summary["suites"]["requests"]
    assert requests["ran"] and requests["success"] is False
    assert requests["unexpected"]["expect_column_values_to_be_in_set(hardware)"] == 1
    assert requests["unexpected"]["expect_column_values_to_not_be_null(id)"] == 0
    disagreements = summary["suites"]["disagreements"]
    assert disagreements["success"] is False
    assert disagreements["unexpected"]["expect_column_values_to_be_between(context_length)"] == 1
    assert summary["by_reason"]["drafted: expect_column_values_to_be_between(position)"] == 1
    drafted = summary["suites"]["drafted"]
    assert drafted["ran"] and drafted["success"] is False
    assert len(drafted["unexpected"]) == 12
    assert drafted["unexpected"]["expect_column_values_to_be_in_set(stage)"] == 1
    assert drafted["unexpected"]["expect_column_values_to_be_between(draft_entropy)"] == 1
    assert len(requests["unexpected"]) == 26
    # Every row that parsed, duplicates included, was stored in the current version.
    parsed = len(rows) - summary["by_stage"]["parse"]
    assert summary["versions_read"] == {"3": parsed}
    json.dumps(summary, allow_nan=False)


@pytest.mark.parametrize("kept", [0, 1])
def test_the_summary_of_a_subset_is_that_of_validating_it(mixed, kept):
    """What retention relies on: the summary of some of one run's rows, from that run's
    verdicts, is what validating those rows gives (every other row, less the duplicate,
    whose first copy may be among those dropped)."""
    rows, result = mixed
    subset = [(s, r) for i, (s, r) in enumerate(rows) if i % 2 == kept and s != "bad-duplicate id"]
    sources = {source for source, _ in subset}
    valid = [
        r.model_dump(mode="json")  # as the ledger keeps them
        for s, r in zip(result.valid_sources, result.valid, strict=True)
        if s in sources
    ]
    quarantined = [e for e in result.quarantined if e["source"] in sources]
    parsed = len(valid) + sum(e["stage"] != "parse" for e in quarantined)
    summary = summary_of_subset(result.summary, valid, quarantined, Counter({3: parsed}))
    assert summary == validate_records(subset, known_hardware=HARDWARE, now=NOW).summary


def test_valid_batch_passes_fully():
    rows = [(f"s{i}", r) for i, r in enumerate([*GOOD, make_record(9, hardware="cuda")])]
    result = validate_records(rows, known_hardware=HARDWARE, now=NOW)
    assert result.quarantined == []
    assert _json(result.valid) == [row for _, row in rows]
    suites = result.summary.suites
    assert all(suites[name].success for name in ("requests", "disagreements", "drafted"))
    assert suites["requests"].rows == 5
    assert suites["disagreements"].rows == 8
    assert suites["drafted"].rows == 16
    assert set(suites["requests"].unexpected.values()) == {0}
    assert set(suites["drafted"].unexpected.values()) == {0}


def test_relaxed_records_with_unverified_drafts_pass():
    kept = make_record(0)
    kept["drafted"][1].update(kept=True)  # kept although the target disagreed
    rows = [("relaxed", relaxed(0, [0, 2])), ("kept", {**kept, "id": "req-kept"})]
    result = validate_records(rows, known_hardware=HARDWARE, now=NOW)
    assert result.quarantined == []


def test_records_from_the_engine_pass(target, prompt):
    """Real detailed records (prompt lookup, exact; a model draft, relaxed) pass all suites."""
    from serving.engine.decoder import SpeculativeDecoder
    from serving.engine.drafters.model import ModelDrafter
    from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
    from serving.engine.policy import FixedK
    from serving.engine.sampling import SamplingParams
    from serving.models.truncated import first_layers
    from serving.records.schema import from_detailed
    from serving.target import LoadedTarget

    loaded = LoadedTarget.of(target)
    decoders = [
        SpeculativeDecoder(loaded, drafter=PromptLookupDrafter(), policy=FixedK(4)),
        SpeculativeDecoder(
            loaded,
            drafter=ModelDrafter(loaded.over(first_layers(target, 1))),
            policy=FixedK(4),
            relax_lambda=0.05,
        ),
    ]
    rows = []
    for index, decoder in enumerate(decoders):
        result = decoder.generate(
            prompt, max_new_tokens=24, sampling=SamplingParams(seed=7), mode="detailed"
        )
        assert result.record is not None
        row = from_detailed(
            result.record,
            record_key=f"engine-{index}",
            prompt_id="p",
            workload="grounded",
            split="train",
            prompt="...",
            output_text="...",
            drafter_version="builtin",
            hardware="cpu",
            run_id="run-1",
            timestamp=NOW - 60.0,
        )
        rows.append((f"engine-{index}", row))
    assert rows[1][1]["unverified"], "the relaxed record should keep unverified drafts"
    result = validate_records(rows, known_hardware=HARDWARE, now=NOW)
    assert result.quarantined == []
    assert result.summary.suites["drafted"].rows == sum(len(row["drafted"]) for _, row in rows)


# ---------------------------------------------------------------------------- old versions


def test_a_version_1_record_passes_after_migration():
    old = json.loads(V1_LINE)
    rows = [("old", copy.deepcopy(old)), ("new", make_record(0))]
    result = validate_records(rows, known_hardware=HARDWARE, now=NOW)
    assert result.quarantined == []
    migrated, current = _json(result.valid)
    assert current == make_record(0)
    assert migrated == {
        **old,
        "schema_version": 3,
        "drafted": [],
        "unverified": [],
        "masked_disagreements": 0,
    }
    summary = result.summary
    assert (summary.schema_version, summary.versions_read) == (3, {"1": 1, "3": 1})
    assert summary.suites["drafted"].rows == 4  # the old record has none


def test_an_old_store_validates_and_only_version_1_rows_run_every_suite(tmp_path):
    """A store of version-1 parts only (as in users' data/ and DVC remotes): the drafted
    suite runs on no rows and passes; a broken old row is quarantined in its raw form."""
    old = json.loads(V1_LINE)
    broken = {**old, "id": "old-broken", "checks": 0}
    root = tmp_path / "store"
    write_jsonl_atomic(partition_dir(root, "cpu", NOW) / "part-old-00000.jsonl", [old, broken])
    result = validate_store(root, known_hardware=HARDWARE, run_id="old", now=NOW)
    assert [r.id for r in result.valid] == [old["id"]]
    assert result.valid[0].drafted == [] and result.valid[0].schema_version == 3
    [entry] = result.quarantined
    assert entry["record"] == broken and entry["stage"] == "expectations"
    assert "expect_column_values_to_be_between(checks)" in entry["reasons"]
    drafted = result.summary.suites["drafted"]
    assert (drafted.ran, drafted.success, drafted.rows) == (True, True, 0)
    assert result.summary.versions_read == {"1": 2}


def test_no_surviving_rows_skips_great_expectations():
    rows = [("a", "garbage"), ("b", {"id": "x"})]
    result = validate_records(rows, known_hardware=HARDWARE, now=NOW)
    assert result.valid == []
    assert [e["stage"] for e in result.quarantined] == ["parse", "parse"]
    skipped = {"ran": False, "success": None, "rows": 0, "unexpected": {}}
    assert result.summary.model_dump(mode="json")["suites"] == {
        "requests": skipped,
        "disagreements": skipped,
        "drafted": skipped,
    }
    assert result.summary.versions_read == {}
    assert validate_records([], known_hardware=HARDWARE).summary.total == 0


def test_bad_arguments_fail_early():
    with pytest.raises(BadInputError, match="non-empty"):
        validate_records([], known_hardware=[])
    with pytest.raises(BadInputError, match="not one string"):
        validate_records([], known_hardware="cpu")


def test_validate_store_round_trip_is_idempotent(tmp_path):
    root = tmp_path / "store"
    part_dir = partition_dir(root, "cpu", NOW)
    write_jsonl_atomic(part_dir / "part-run-1-0.jsonl", [make_record(0), make_record(1)])
    write_jsonl_atomic(
        part_dir / "part-run-1-1.jsonl",
        [
            changed(2, acceptance_rate=float("nan")),  # written as NaN, read back as nan
            make_record(0),
            changed_disagreement(3, 0, target_prob_of_target=1.2),
            nothing_drafted(4),
        ],
    )
    with (part_dir / "part-run-1-1.jsonl").open("a") as handle:
        handle.write("{truncated\n")

    first = validate_store(root, known_hardware=HARDWARE, run_id="v1", now=NOW)
    quarantine = quarantine_path(root, "v1")
    report = root / "reports" / "validation-v1.json"
    saved = (quarantine.read_bytes(), report.read_bytes())

    assert [r.id for r in first.valid] == ["req-0", "req-1", "req-4"]
    lines = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert lines == json.loads(json.dumps(first.quarantined))
    assert [(e["stage"], e["source"].rsplit(":", 1)[1]) for e in lines] == [
        ("parse", "1"),
        ("duplicate", "2"),
        ("expectations", "3"),
        ("parse", "5"),
    ]
    assert math.isnan(lines[0]["record"]["acceptance_rate"])
    assert lines[3]["reasons"] == ["not JSON"]
    assert lines[1]["reasons"] == [
        f"duplicate id req-0 (first at {part_dir.relative_to(root)}/part-run-1-0.jsonl:1)"
    ]
    summary = json.loads(report.read_text())
    assert summary == first.summary.model_dump(mode="json")
    assert summary["run_id"] == "v1"
    assert summary["quarantine_file"] == "quarantine/part-v1.jsonl"
    assert (summary["total"], summary["valid"], summary["quarantined"]) == (7, 3, 4)
    # The quarantine is outside the records area: it is not read back as records.
    assert sum(1 for _ in read_raw(root)) == 7

    second = validate_store(root, known_hardware=HARDWARE, run_id="v1", now=NOW)
    assert (quarantine.read_bytes(), report.read_bytes()) == saved
    assert second.summary == first.summary


def test_validate_store_removes_a_stale_quarantine(tmp_path):
    root = tmp_path / "store"
    stale = quarantine_path(root, "v2")
    write_jsonl_atomic(stale, [{"source": "old", "record": "x", "stage": "parse"}])
    write_jsonl_atomic(partition_dir(root, "cpu", NOW) / "part-a-0.jsonl", [make_record(0)])
    reports = tmp_path / "reports"
    result = validate_store(root, known_hardware=HARDWARE, run_id="v2", report_dir=reports, now=NOW)
    assert result.quarantined == [] and not stale.exists()
    assert json.loads((reports / "validation-v2.json").read_text())["quarantine_file"] is None


@pytest.mark.parametrize("run_id", ["", "../x", ".hidden", "a/b"])
def test_validate_store_rejects_a_run_id_that_cannot_name_a_file(tmp_path, run_id):
    with pytest.raises(BadInputError, match="run_id"):
        validate_store(tmp_path, known_hardware=HARDWARE, run_id=run_id)
