"""The training mix: failures plus seeded replay from trainable successes; held-out split
for eval; the newest train traffic per workload held out by time."""

from __future__ import annotations

import json
import math
import random

import pytest

from serving.errors import BadInputError
from serving.records.schema import RequestRecord, parse_record
from tasks.data.dataset import (
    PARTS,
    build_dataset,
    heldout_traffic_records,
    holdout_by_time,
    read_part,
    write_dataset,
)
from tests.tasks.data.test_validate import make_record

# The mix tests below are about failures and replay: nothing held out by time.
NO_HOLDOUT = 0.0


def _rec(**fields) -> RequestRecord:
    """A valid record with these fields (the rest as :func:`make_record` has them)."""
    return parse_record(make_record(0, **fields))


def _rows(
    prefix: str, n: int, *, split: str, failure: bool, workload: str = "grounded"
) -> list[RequestRecord]:
    return [
        _rec(
            id=f"{prefix}{i}",
            workload=workload,
            split=split,
            is_failure=failure,
            timestamp=1000.0 + i,
        )
        for i in range(n)
    ]


RECORDS = (
    _rows("fail-", 8, split="train", failure=True)
    + _rows("ok-", 20, split="train", failure=False)
    + _rows("held-fail-", 3, split="heldout", failure=True)
    + _rows("held-ok-", 4, split="heldout", failure=False)
)


def _ids(rows: list[RequestRecord]) -> list[str]:
    return [r.id for r in rows]


def test_mix_has_the_configured_failure_share():
    dataset = build_dataset(RECORDS, failure_share=0.8, seed=0, heldout_share=NO_HOLDOUT)
    assert tuple(dataset.parts()) == PARTS  # in the order the files are written
    assert _ids(dataset.failures) == [f"fail-{i}" for i in range(8)]
    assert len(dataset.replay) == 2  # 8 failures at 80% -> 2 replay at 20%
    assert sorted(_ids(dataset.train_mix)) == sorted(_ids(dataset.failures) + _ids(dataset.replay))
    share = 8 / len(dataset.train_mix)
    assert share == pytest.approx(0.8)


@pytest.mark.parametrize("share, replay", [(1.0, 0), (0.8, 2), (0.5, 8), (0.25, 20), (0.1, 20)])
def test_replay_size_follows_the_share_up_to_the_successes_available(share, replay):
    assert (
        len(build_dataset(RECORDS, failure_share=share, heldout_share=NO_HOLDOUT).replay) == replay
    )


def test_replay_comes_only_from_train_successes_and_eval_only_from_heldout():
    dataset = build_dataset(RECORDS, failure_share=0.25, seed=3, heldout_share=NO_HOLDOUT)
    assert all(r.split == "train" and not r.is_failure for r in dataset.replay)
    assert all(r.split == "train" for r in dataset.train_mix)
    assert _ids(dataset.eval) == _ids([r for r in RECORDS if r.split == "heldout"])
    trained = set(_ids(dataset.train_mix))
    assert not trained & set(_ids(dataset.eval))


def test_no_failures_means_an_empty_mix():
    successes = _rows("ok-", 5, split="train", failure=False)
    dataset = build_dataset(successes)
    assert dataset.failures == dataset.replay == dataset.train_mix == []


def test_mix_is_deterministic_per_seed_and_order_free():
    first = build_dataset(RECORDS, seed=5)
    assert build_dataset(RECORDS, seed=5) == first
    assert build_dataset(list(reversed(RECORDS)), seed=5).replay == first.replay
    assert build_dataset(list(reversed(RECORDS)), seed=5).train_mix == first.train_mix
    reversed_heldout = build_dataset(list(reversed(RECORDS)), seed=5).heldout_traffic
    assert reversed_heldout == first.heldout_traffic
    picks = {tuple(_ids(build_dataset(RECORDS, seed=seed).replay)) for seed in range(6)}
    assert len(picks) > 1  # the seed chooses which successes are replayed
    orders = {tuple(_ids(build_dataset(RECORDS, seed=seed).train_mix)) for seed in range(6)}
    assert len(orders) > 1


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_failure_share_out_of_range_raises(share):
    with pytest.raises(ValueError, match="failure_share must be in"):
        build_dataset(RECORDS, failure_share=share)


def test_write_dataset_writes_every_split(tmp_path):
    dataset = build_dataset(RECORDS)
    counts = write_dataset(dataset, tmp_path / "out")
    parts = dataset.parts()
    assert counts == {name: len(parts[name]) for name in PARTS}
    for name in PARTS:
        lines = (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == [
            r.model_dump(mode="json") for r in parts[name]
        ]


def test_a_written_part_reads_back_as_the_same_records(tmp_path):
    dataset = build_dataset(RECORDS)
    write_dataset(dataset, tmp_path)
    for name, records in dataset.parts().items():
        assert read_part(tmp_path, name) == records
    with pytest.raises(BadInputError, match="no dataset part 'train'"):
        read_part(tmp_path, "train")
    with pytest.raises(BadInputError, match="build the dataset first"):
        read_part(tmp_path / "nowhere", "eval")
    (tmp_path / "eval.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(BadInputError, match=r"eval.jsonl:1 is not a request record \(.*prompt"):
        read_part(tmp_path, "eval")


# ------------------------------------------------------------------ held out by time


def _traffic(rng: random.Random) -> list[RequestRecord]:
    """Train and held-out-split records of three workloads, with timestamps drawn from a
    small range (so that ties happen) and random failure flags, in a random order."""
    records = []
    for workload, n in (("sharegpt", rng.randint(0, 12)), ("grounded", rng.randint(1, 30))):
        for i in range(n):
            records.append(
                _rec(
                    id=f"{workload}-{rng.randrange(10**6):06d}-{i}",
                    workload=workload,
                    split=rng.choice(["train", "train", "train", "heldout"]),
                    is_failure=rng.random() < 0.6,
                    timestamp=float(rng.randint(0, 8)),
                )
            )
    records.append(  # a lone live request
        _rec(id="live-0", workload="live", split="train", is_failure=True, timestamp=9.0)
    )
    rng.shuffle(records)
    return records


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("share", [0.0, 0.1, 0.2, 0.5, 0.9])
def test_held_out_traffic_never_leaks_into_training(share, seed):
    records = _traffic(random.Random(seed))
    dataset = build_dataset(records, failure_share=0.5, seed=seed, heldout_share=share)
    held = {r.id for r in dataset.heldout_traffic}
    for part in ("failures", "replay", "train_mix"):
        assert not held & {r.id for r in dataset.parts()[part]}, part
    assert all(r.split == "train" for r in dataset.heldout_traffic)
    assert dataset.eval == [r for r in records if r.split == "heldout"]

    trainable, heldout = holdout_by_time(records, share)
    assert heldout == dataset.heldout_traffic == heldout_traffic_records(records, share)
    train = [r for r in records if r.split == "train"]
    assert sorted(r.id for r in trainable + heldout) == sorted(r.id for r in train)
    for workload in {r.workload for r in train}:
        kept = [(r.timestamp, r.id) for r in trainable if r.workload == workload]
        newest = [(r.timestamp, r.id) for r in heldout if r.workload == workload]
        n = len(kept) + len(newest)
        assert len(newest) == (0 if n == 1 else min(math.ceil(share * n), n - 1))
        assert kept, "every workload keeps something to train on"
        assert not newest or max(kept) < min(newest)  # the held-out records are the newest
    # The split does not depend on the order the records were read in.
    shuffled = list(records)
    random.Random(seed + 100).shuffle(shuffled)
    assert holdout_by_time(shuffled, share)[1] == heldout


def test_the_newest_share_of_each_workload_is_held_out():
    records = _rows("g", 10, split="train", failure=True) + _rows(
        "s", 5, split="train", failure=False, workload="sharegpt"
    )
    trainable, heldout = holdout_by_time(records, 0.2)
    # ceil(0.2 * 10) = 2 grounded, ceil(0.2 * 5) = 1 sharegpt; in time order.
    assert [r.id for r in heldout] == ["s4", "g8", "g9"]
    assert [r.id for r in trainable] == [f"g{i}" for i in range(8)] + [f"s{i}" for i in range(4)]
    # ceil, with 0.7 * 10 = 7.000000000000001 counted as 7.
    assert len(heldout_traffic_records(_rows("g", 10, split="train", failure=True), 0.7)) == 7


def test_ties_in_time_are_broken_by_id():
    same_time = [
        _rec(id=name, workload="live", split="train", is_failure=False, timestamp=5.0)
        for name in ("b", "d", "a", "c")
    ]
    assert [r.id for r in heldout_traffic_records(same_time, 0.5)] == ["c", "d"]
    assert heldout_traffic_records(list(reversed(same_time)), 0.5) == heldout_traffic_records(
        same_time, 0.5
    )


def test_a_lone_record_trains_and_every_workload_keeps_one():
    (lone,) = _rows("g", 1, split="train", failure=True)
    assert holdout_by_time([lone], 0.5) == ([lone], [])
    pair = _rows("g", 2, split="train", failure=True)
    assert holdout_by_time(pair, 0.9) == ([pair[0]], [pair[1]])  # not ceil(1.8) = 2


def test_share_zero_holds_nothing_out():
    assert holdout_by_time(RECORDS, 0.0) == ([r for r in RECORDS if r.split == "train"], [])
    assert build_dataset(RECORDS, heldout_share=0.0).heldout_traffic == []


def test_heldout_split_records_are_eval_whatever_the_share():
    for share in (0.0, 0.2, 0.9):
        dataset = build_dataset(RECORDS, heldout_share=share)
        assert dataset.eval == [r for r in RECORDS if r.split == "heldout"]
        assert not {r.id for r in dataset.heldout_traffic} & {r.id for r in dataset.eval}


@pytest.mark.parametrize("share", [-0.1, 1.0, 1.5, float("nan")])
def test_heldout_share_out_of_range_names_the_value(share):
    with pytest.raises(BadInputError, match=rf"heldout_share must be in \[0, 1\), got {share!r}"):
        holdout_by_time(RECORDS, share)
    with pytest.raises(BadInputError, match="heldout_share must be in"):
        build_dataset(RECORDS, heldout_share=share)
