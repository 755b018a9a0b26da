"""Acceptance by position from records: the counting rule on hand-made steps, a round trip
through the simulator's own sampler, and grouping of stored and detailed records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from serving.atomic import write_jsonl_atomic
from serving.engine.detailed import DetailedRecord
from serving.errors import BadInputError
from serving.records import store
from serving.records.schema import from_detailed
from tasks.simulate.acceptance import drafters_section, estimate_records, estimate_steps
from tasks.simulate.config import parse_scenario
from tasks.simulate.model import Acceptance, Uniforms


def test_steps_count_as_trials_up_to_the_first_rejection() -> None:
    steps = [(4, 4), (4, 2), (4, 0), (2, 2), (0, 0)]
    estimate = estimate_steps(steps, name="d")
    # (4,4) tries 0..3; (4,2) tries 0..2; (4,0) tries 0; (2,2) tries 0..1; (0,0) nothing
    assert estimate.trials == [4, 3, 2, 1]
    assert estimate.kept == [3, 3, 1, 1]
    assert estimate.acceptance_by_position == [0.75, 1.0, 0.5, 1.0]
    assert (estimate.steps, estimate.longest) == (5, 4)
    assert estimate.mean_proposed == pytest.approx(2.8)
    section = estimate.drafter_section(k=6, draft_s_per_token=0.002)
    assert section["acceptance_by_position"] == [0.75, 1.0, 0.5, 1.0, 0.0, 0.0]
    assert section["k"] == 6 and section["draft_s_per_token"] == 0.002


def test_positions_nobody_reached_are_none_and_zero_in_the_section() -> None:
    estimate = estimate_steps([(3, 0), (3, 0)], name="d")
    assert estimate.acceptance_by_position == [0.0, None, None]
    assert estimate.drafter_section()["acceptance_by_position"] == [0.0, 0.0, 0.0]


def test_bad_steps_are_refused() -> None:
    with pytest.raises(BadInputError, match=r"step \[2, 3\]"):
        estimate_steps([(2, 3)], name="d")
    with pytest.raises(BadInputError, match=r"step \[1, 1, 1\]"):
        estimate_steps([(1, 1, 1)], name="d")


def test_the_simulator_sampler_round_trips() -> None:
    probabilities = [0.9, 0.6, 0.3, 0.7]
    acceptance = Acceptance(probabilities, Uniforms(np.random.default_rng(5)))
    steps = [(4, acceptance.sample(4)) for _ in range(40_000)]
    estimated = estimate_steps(steps, name="d").acceptance_by_position
    assert estimated == pytest.approx(probabilities, abs=0.02)


def _detailed(name: str, steps: list[list[int]]) -> DetailedRecord:
    return DetailedRecord(
        request_id=f"{name}-{steps}",
        drafter={"name": name, "kind": name},
        policy={"name": "fixed"},
        sampling={"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": None},
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 5],
        from_draft=[True, False],
        acceptance_rate=None,
        mean_accepted_length=None,
        draft_tokens=sum(p for p, _ in steps),
        accepted_tokens=sum(a for _, a in steps),
        checks=len(steps),
        steps=steps,
    )


def _stored(detailed: DetailedRecord, workload: str, number: int) -> dict:
    return from_detailed(
        detailed,
        record_key=f"id-{number}",
        prompt_id=f"p{number}",
        workload=workload,
        split="train",
        prompt="p",
        output_text="o",
        drafter_version="builtin",
        hardware="cpu",
        run_id="test",
        timestamp=1_700_000_000.0,
    )


def test_a_store_groups_by_drafter_and_workload(tmp_path: Path) -> None:
    rows = [
        _stored(_detailed("pld", [[2, 2], [2, 1]]), "sharegpt", 0),
        _stored(_detailed("pld", [[2, 0]]), "sharegpt", 1),
        _stored(_detailed("pld", [[2, 2]]), "humaneval", 2),
        _stored(_detailed("ngram", [[1, 1]]), "sharegpt", 3),
    ]
    part = store.partition_dir(tmp_path, "cpu", 1_700_000_000.0) / "part-test-00000.jsonl"
    write_jsonl_atomic(part, rows)
    estimates = {e.name: e for e in estimate_records([tmp_path])}
    assert sorted(estimates) == ["ngram/sharegpt", "pld/humaneval", "pld/sharegpt"]
    sharegpt = estimates["pld/sharegpt"]
    assert (sharegpt.requests, sharegpt.steps) == (2, 3)
    assert sharegpt.trials == [3, 2] and sharegpt.kept == [2, 1]
    assert sharegpt.workload == "sharegpt" and sharegpt.drafter == "pld"
    section = drafters_section(list(estimates.values()))
    assert [d["share"] for d in section["drafters"]] == pytest.approx([0.25, 0.25, 0.5])
    scenario = {
        "targets": [{"name": "t", "one_token_pass_s": 0.05, "batch_curve": [[1, 1.0]]}],
        "drafters": section["drafters"],
        "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
        "duration_s": 10.0,
    }
    assert [d.name for d in parse_scenario(scenario).drafters] == sorted(estimates)


def test_detailed_records_group_per_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.json"
    first.write_text(json.dumps(_detailed("pld", [[3, 1]]).to_dict()) + "\n\n")
    second.write_text(json.dumps([_detailed("pld", [[3, 3]]).to_dict()]))
    alone = estimate_records([first])
    assert [(e.name, e.workload, e.trials) for e in alone] == [("pld", None, [1, 1, 0])]
    both = estimate_records([first, second])
    assert [e.name for e in both] == ["pld/a.jsonl", "pld/b.json"]


def test_unreadable_records_are_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"drafter": {"name": "pld"}, "steps": [[1, "x"]]}) + "\n")
    with pytest.raises(BadInputError, match=r"bad\.jsonl:1.*steps"):
        estimate_records([path])
    path.write_text("{not json\n")
    with pytest.raises(BadInputError, match=r"bad\.jsonl:1 is not JSON"):
        estimate_records([path])
    path.write_text(json.dumps({"drafter": "pld", "steps": [[1, 1]]}) + "\n")
    with pytest.raises(BadInputError, match=r"bad\.jsonl:1 is not a readable record"):
        estimate_records([path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="no records with steps"):
        estimate_records([tmp_path / "empty"])
