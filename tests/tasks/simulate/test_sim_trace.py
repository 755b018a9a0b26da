"""Captured traffic replayed as trace arrivals: in time order, rebased to 0, with each
request's own lengths; engine records without timestamps and empty selections refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.atomic import write_jsonl_atomic
from serving.engine.detailed import DetailedRecord
from serving.errors import BadInputError
from serving.records import store
from serving.records.schema import from_detailed
from tasks.simulate.config import parse_scenario
from tasks.simulate.model import simulate
from tasks.simulate.trace import trace_from_records


def _record(prompt: list[int], output: list[int], workload: str, at: float, n: int) -> dict:
    detailed = DetailedRecord(
        request_id=f"r{n}",
        drafter={"name": "pld", "kind": "pld"},
        policy={"name": "fixed"},
        sampling={"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": None},
        prompt_token_ids=prompt,
        output_token_ids=output,
        from_draft=[False] * len(output),
        acceptance_rate=None,
        mean_accepted_length=None,
        draft_tokens=0,
        accepted_tokens=0,
        checks=len(output),
        steps=[[0, 0]] * len(output),
    )
    return from_detailed(
        detailed, record_key=f"k{n}", prompt_id=f"p{n}", workload=workload, split="train",
        prompt="p", output_text="o", drafter_version="builtin", hardware="cpu",
        run_id="test", timestamp=at,
    )  # fmt: skip


def test_records_become_a_replayable_trace(tmp_path: Path) -> None:
    rows = [
        _record([1, 2, 3, 4], [5, 6], "sharegpt", 1_700_000_010.5, 0),
        _record([1, 2], [5, 6, 7], "sharegpt", 1_700_000_000.0, 1),
        _record([1, 2, 3], [5], "humaneval", 1_700_000_004.0, 2),
    ]
    part = store.partition_dir(tmp_path, "cpu", 1_700_000_000.0) / "part-test-00000.jsonl"
    write_jsonl_atomic(part, rows)
    arrivals = trace_from_records([tmp_path])
    assert arrivals["timestamps"] == [0.0, 4.0, 10.5]
    assert arrivals["prompt_tokens"] == [1, 2, 3]  # all but the last token is prefilled
    assert arrivals["output_tokens"] == [3, 1, 2]
    only = trace_from_records([tmp_path], workload="sharegpt")
    assert only["timestamps"] == [0.0, 10.5]
    scenario = {
        "targets": [{"name": "t", "one_token_pass_s": 0.05, "batch_curve": [[1, 1.0]]}],
        "drafters": [{"name": "none", "k": 0}],
        "arrivals": arrivals,
        "duration_s": 20.0,
    }
    log = simulate(parse_scenario(scenario))
    assert [(r.arrival_s, r.output_tokens) for r in log.requests] == [
        (0.0, 3), (4.0, 1), (10.5, 2)
    ]  # fmt: skip
    with pytest.raises(BadInputError, match="no records of workload 'other'"):
        trace_from_records([tmp_path], workload="other")


def test_engine_records_have_no_timestamp(tmp_path: Path) -> None:
    detailed = tmp_path / "d.jsonl"
    detailed.write_text(json.dumps({"drafter": {"name": "pld"}, "steps": [[1, 1]]}) + "\n")
    with pytest.raises(BadInputError, match="without a timestamp"):
        trace_from_records([detailed])
