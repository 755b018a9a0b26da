"""Workloads by name and drift scenarios over the real packaged data (tasks/data/traffic.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from serving.errors import BadInputError
from serving.records.schema import WORKLOADS
from tasks.data.prompts import split_of
from tasks.data.traffic import build_workload, drift_scenario

# ------------------------------------------------------------------------ workloads


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_deterministic_per_seed(pairs, name: str) -> None:
    first = build_workload(name, 20, seed=7, split="heldout")
    assert first == build_workload(name, 20, seed=7, split="heldout")
    other = build_workload(name, 20, seed=8, split="heldout")
    assert [p.id for p in first] != [p.id for p in other]
    # A larger n extends a smaller one with the same seed.
    assert build_workload(name, 10, seed=7, split="heldout") == first[:10]
    assert len({p.id for p in first}) == len(first)
    assert {p.workload for p in first} == {name}


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_prompts_are_well_formed(pairs, name: str, split: str) -> None:
    for prompt in build_workload(name, 25, seed=0, split=split):
        assert prompt.split == split
        assert len(prompt.messages) == 1
        assert prompt.messages[0]["role"] == "user"
        assert prompt.messages[0]["content"].strip()
        assert prompt.reference
        # A grounded prompt has its source prompt's split: "grounded-<template>:<source id>".
        key = prompt.id.split(":", 1)[1] if name == "grounded" else prompt.id
        assert split_of(key) == split


@pytest.mark.parametrize(("name", "n"), [("sharegpt", 1500), ("humaneval", 29), ("grounded", 1000)])
def test_train_and_heldout_never_share_prompts(pairs, name: str, n: int) -> None:
    train = build_workload(name, n, seed=1, split="train")
    heldout = build_workload(name, n, seed=1, split="heldout")
    assert not {p.id for p in train} & {p.id for p in heldout}
    assert not {p.messages[0]["content"] for p in train} & {
        p.messages[0]["content"] for p in heldout
    }


# --------------------------------------------------------------------------- errors


def test_unknown_workload_names_the_value_and_choices() -> None:
    with pytest.raises(BadInputError, match="'chitchat'") as error:
        build_workload("chitchat", 5, seed=0)
    for name in WORKLOADS:
        assert name in str(error.value)
    assert "file:PATH" in str(error.value)


@pytest.mark.parametrize("n", [0, -3, True, 2.5])
@pytest.mark.parametrize("name", WORKLOADS)
def test_bad_n_is_rejected(name: str, n) -> None:
    with pytest.raises(BadInputError, match=re.escape(f"n must be a positive integer, got {n!r}")):
        build_workload(name, n, seed=0)


def test_bad_split_is_rejected() -> None:
    with pytest.raises(BadInputError, match="'test'"):
        build_workload("humaneval", 5, seed=0, split="test")


# ----------------------------------------------------------------- a user's own traffic


def _requests_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "requests.jsonl"
    lines = [
        json.dumps({"messages": [{"role": "user", "content": f"question {i}"}], "id": f"q{i}"})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("split", ["train", "all"])
def test_a_file_workload_is_its_first_n_requests_in_file_order(tmp_path, split) -> None:
    path = _requests_file(tmp_path, 5)
    prompts = build_workload(f"file:{path}", 3, seed=7, split=split)
    assert [p.id for p in prompts] == ["q0", "q1", "q2"]
    assert {(p.workload, p.split) for p in prompts} == {("live", "train")}
    assert build_workload(f"file:{path}", 3, seed=8, split=split) == prompts  # no seeded pick
    assert build_workload(f"file:{path}", 5, seed=7, split=split)[:3] == prompts


def test_a_file_workload_with_too_few_requests_names_both_numbers(tmp_path) -> None:
    path = _requests_file(tmp_path, 2)
    with pytest.raises(
        BadInputError, match=re.escape(f"n=3 requests but {str(path)!r} has only 2")
    ):
        build_workload(f"file:{path}", 3, seed=0, split="train")


def test_a_file_workload_has_no_heldout_split(tmp_path) -> None:
    path = _requests_file(tmp_path, 2)
    with pytest.raises(BadInputError, match="chosen by time") as caught:
        build_workload(f"file:{path}", 1, seed=0, split="heldout")
    assert "'heldout'" in str(caught.value) and "'train' or 'all'" in str(caught.value)


def test_a_file_workload_checks_n_and_names_a_missing_file(tmp_path) -> None:
    with pytest.raises(BadInputError, match="n must be a positive integer, got 0"):
        build_workload(f"file:{_requests_file(tmp_path, 2)}", 0, seed=0, split="train")
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(
        BadInputError, match=re.escape(f"cannot read chat requests file {str(missing)!r}")
    ):
        build_workload(f"file:{missing}", 1, seed=0, split="train")
    with pytest.raises(BadInputError, match="names no file"):
        build_workload("file:", 1, seed=0, split="train")


# ---------------------------------------------------------------------------- drift


def test_drift_scenario_switches_traffic_kind(pairs) -> None:
    scenario = drift_scenario(10, seed=2, split="heldout")
    assert [phase for phase, _ in scenario] == [0] * 10 + [1] * 10
    assert {p.workload for phase, p in scenario if phase == 0} == {"sharegpt"}
    assert {p.workload for phase, p in scenario if phase == 1} == {"humaneval"}
    assert [p for _, p in scenario[:10]] == build_workload("sharegpt", 10, seed=2)
    assert scenario == drift_scenario(10, seed=2, split="heldout")


def test_drift_scenario_repeated_phase_gets_fresh_prompts(pairs) -> None:
    phases = ("grounded", "sharegpt", "grounded")
    scenario = drift_scenario(8, seed=4, phases=phases, split="train")
    assert len(scenario) == 24
    assert [p.workload for _, p in scenario] == [name for name in phases for _ in range(8)]
    assert len({p.id for _, p in scenario}) == 24


@pytest.mark.parametrize("phases", [(), "sharegpt", ("sharegpt", "nope")])
def test_drift_scenario_rejects_bad_phases(phases) -> None:
    with pytest.raises(BadInputError):
        drift_scenario(3, seed=0, phases=phases)
