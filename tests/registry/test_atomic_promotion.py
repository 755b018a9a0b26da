"""Promotion stays atomic when two flows race: a lock per store and target, and a
compare-and-swap on the champion the evaluation compared against."""

import threading

import pytest

from registry.client import RegistryError, promotion_lock_path
from serving.engine.drafters.package import DraftManifest, write_package


def evaluated_draft(registry, tmp_path, drafter, family="ngram", hardware="cpu"):
    package = write_package(tmp_path / drafter.replace(":", "-"), DraftManifest(drafter=drafter))
    draft = registry.log_draft(package, family=family)
    registry.log_evaluation(draft, hardware, {"speedup": 1.5})
    return registry.get(family, draft.version)


def promotions(registry, hardware="cpu"):
    return registry.client.search_runs(
        [registry.promotions_id], filter_string=f"tags.hardware = '{hardware}'"
    )


def test_a_promotion_checked_against_a_moved_champion_is_refused(registry, tmp_path):
    old = evaluated_draft(registry, tmp_path, "pld:1")
    registry.promote(old, "cpu", reason="bootstrap", expected_champion=None)
    new = evaluated_draft(registry, tmp_path, "pld:2", family="head")
    other = evaluated_draft(registry, tmp_path, "pld:3", family="suffix")
    registry.promote(other, "cpu", reason="meanwhile")  # the default checks nothing
    with pytest.raises(RegistryError) as refused:
        registry.promote(new, "cpu", reason="late", expected_champion=old.label)
    assert str(refused.value) == (
        f"the champion of 'cpu' moved from {old.label} to {other.label} since the evaluation "
        f"that justified promoting {new.label}; re-evaluate {new.label} against the new champion"
    )
    assert registry.champion("cpu").label == other.label
    assert len(promotions(registry)) == 2  # a refused promotion leaves no audit run
    registry.promote(new, "cpu", reason="re-evaluated", expected_champion=other.label)
    assert registry.champion("cpu").label == new.label


def test_expecting_no_champion_is_refused_once_there_is_one(registry, tmp_path):
    first = evaluated_draft(registry, tmp_path, "pld:1")
    second = evaluated_draft(registry, tmp_path, "pld:2")
    registry.promote(first, "cpu", reason="first", expected_champion=None)
    with pytest.raises(RegistryError, match=r"moved from none \(plain decoding\) to t-ngram/1"):
        registry.promote(second, "cpu", reason="second", expected_champion=None)


def test_two_racing_promotions_one_wins_and_the_other_is_told_why(registry, tmp_path):
    old = evaluated_draft(registry, tmp_path, "pld:1")
    registry.promote(old, "cpu", reason="bootstrap")
    racers = [
        evaluated_draft(registry, tmp_path, "pld:2", family="head"),
        evaluated_draft(registry, tmp_path, "pld:3", family="suffix"),
    ]
    start = threading.Barrier(len(racers))
    won: list[str] = []
    refused: list[str] = []

    def race(draft):
        start.wait()
        try:
            registry.promote(draft, "cpu", reason="race", expected_champion=old.label)
            won.append(draft.label)
        except RegistryError as error:
            refused.append(str(error))

    threads = [threading.Thread(target=race, args=(draft,)) for draft in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 1, (won, refused)
    assert f"moved from {old.label} to {won[0]}" in refused[0]
    assert registry.champion("cpu").label == won[0]
    races = [r for r in promotions(registry) if r.data.tags["reason"] == "race"]
    assert len(races) == 1
    assert races[0].data.tags["previous_version"] == old.version
    loser = next(d for d in racers if d.label != won[0])
    assert registry.by_alias(loser.family, "champion-cpu") is None


def test_the_lock_lies_beside_a_sqlite_store_and_in_the_cache_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_CACHE", str(tmp_path / "cache"))
    beside = promotion_lock_path(f"sqlite:///{tmp_path}/m.db", "cpu")
    assert beside == tmp_path / "m.db.promote-cpu.lock"
    remote = promotion_lock_path("http://mlflow:5000", "cpu-vllm")
    assert remote.parent == tmp_path / "cache" / "locks"
    assert remote.name.endswith("-promote-cpu-vllm.lock")
    assert remote != promotion_lock_path("http://other:5000", "cpu-vllm")
    with pytest.raises(RegistryError, match="cannot name an alias"):
        promotion_lock_path("http://mlflow:5000", "../x")
