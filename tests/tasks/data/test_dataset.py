"""The training mix: failures plus seeded replay from train successes; held-out for eval."""

from __future__ import annotations

import json

import pytest

from tasks.data.dataset import PARTS, build_dataset, write_dataset


def _rows(prefix: str, n: int, *, split: str, failure: bool) -> list[dict]:
    return [{"id": f"{prefix}{i}", "split": split, "is_failure": failure} for i in range(n)]


RECORDS = (
    _rows("fail-", 8, split="train", failure=True)
    + _rows("ok-", 20, split="train", failure=False)
    + _rows("held-fail-", 3, split="heldout", failure=True)
    + _rows("held-ok-", 4, split="heldout", failure=False)
)


def _ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


def test_mix_has_the_configured_failure_share():
    dataset = build_dataset(RECORDS, failure_share=0.8, seed=0)
    assert set(dataset) == set(PARTS)
    assert _ids(dataset["failures"]) == [f"fail-{i}" for i in range(8)]
    assert len(dataset["replay"]) == 2  # 8 failures at 80% -> 2 replay at 20%
    assert sorted(_ids(dataset["train_mix"])) == sorted(
        _ids(dataset["failures"]) + _ids(dataset["replay"])
    )
    share = 8 / len(dataset["train_mix"])
    assert share == pytest.approx(0.8)


@pytest.mark.parametrize("share, replay", [(1.0, 0), (0.8, 2), (0.5, 8), (0.25, 20), (0.1, 20)])
def test_replay_size_follows_the_share_up_to_the_successes_available(share, replay):
    assert len(build_dataset(RECORDS, failure_share=share)["replay"]) == replay


def test_replay_comes_only_from_train_successes_and_eval_only_from_heldout():
    dataset = build_dataset(RECORDS, failure_share=0.25, seed=3)
    assert all(r["split"] == "train" and not r["is_failure"] for r in dataset["replay"])
    assert all(r["split"] == "train" for r in dataset["train_mix"])
    assert _ids(dataset["eval"]) == _ids([r for r in RECORDS if r["split"] == "heldout"])
    trained = set(_ids(dataset["train_mix"]))
    assert not trained & set(_ids(dataset["eval"]))


def test_no_failures_means_an_empty_mix():
    successes = _rows("ok-", 5, split="train", failure=False)
    dataset = build_dataset(successes)
    assert dataset["failures"] == dataset["replay"] == dataset["train_mix"] == []


def test_mix_is_deterministic_per_seed_and_order_free():
    first = build_dataset(RECORDS, seed=5)
    assert build_dataset(RECORDS, seed=5) == first
    assert build_dataset(list(reversed(RECORDS)), seed=5)["replay"] == first["replay"]
    assert build_dataset(list(reversed(RECORDS)), seed=5)["train_mix"] == first["train_mix"]
    picks = {tuple(_ids(build_dataset(RECORDS, seed=seed)["replay"])) for seed in range(6)}
    assert len(picks) > 1  # the seed chooses which successes are replayed
    orders = {tuple(_ids(build_dataset(RECORDS, seed=seed)["train_mix"])) for seed in range(6)}
    assert len(orders) > 1


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_failure_share_out_of_range_raises(share):
    with pytest.raises(ValueError, match="failure_share must be in"):
        build_dataset(RECORDS, failure_share=share)


def test_write_dataset_writes_every_split(tmp_path):
    dataset = build_dataset(RECORDS)
    counts = write_dataset(dataset, tmp_path / "out")
    assert counts == {name: len(dataset[name]) for name in PARTS}
    for name in PARTS:
        lines = (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == dataset[name]
