"""Retention: parts older than the configured age leave the store, and with them every copy
validation kept (batch valid and quarantine rows, dataset files), while the ledger stays
consistent, so that incremental validation goes on where it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from serving.errors import BadInputError
from serving.gateway.sink import ACCEPTANCE, PAIRS
from serving.hardware import load_hardware
from serving.records import store
from tasks.data import ledger, retention
from tasks.data.curate import curate
from tasks.data.dataset import PARTS
from tasks.data.incremental import validate_incrementally
from tasks.data.retention import apply_retention, check_days, load_store_config
from tasks.data.validate import combine_summaries, validate_records
from tests.serving.records.test_schema import V1_LINE
from tests.tasks.data.test_validate import NOW, changed, make_record

DAY = 86_400.0
DAYS = 30
CUTOFF = NOW - DAYS * DAY
OLD = NOW - 40 * DAY


def _put(root: Path, name: str, rows: list, when: float, area: str = store.RECORDS) -> Path:
    """A committed part of ``area`` in the partition of ``when``, written then (a ``str``
    row is written as a raw line, broken or not)."""
    path = store.partition_dir(root, "cpu", when, area) / store.part_name(name, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    os.utime(path, (when, when))
    return path


def _v1(record_id: str, timestamp: float) -> str:
    return json.dumps({**json.loads(V1_LINE), "id": record_id, "timestamp": timestamp})


def _pair(index: int, timestamp: float) -> dict:
    tokens = {"prompt_token_ids": [1, 2], "output_token_ids": [3, 4]}
    return {"id": f"pair-{index}", "timestamp": timestamp, "hardware": "cpu", **tokens}


def _window(timestamp: float) -> dict:
    counts = {"draft_tokens": 8, "accepted_tokens": 4, "requests": 2}
    return {"timestamp": timestamp, "end": timestamp, "champion": "c/1", **counts}


def _validate(root: Path, out: Path) -> dict:
    """The loop's validate step (incremental, under the lock); its summary as JSON."""
    return curate(root, out).model_dump(mode="json")


def _one_pass(root: Path):
    return validate_records(store.read_raw(root), known_hardware=sorted(load_hardware().targets))


def _snapshot(*folders: Path) -> dict[str, bytes]:
    return {
        str(path): path.read_bytes()
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


class World:
    """A store validated twice (two batches), with old and new parts in every area."""

    def __init__(self, tmp_path: Path) -> None:
        self.root, self.out = tmp_path / "store", tmp_path / "dataset"
        root = self.root
        tpu = {"hardware": "tpu"}  # quarantined by the expectations
        # Batch 0 holds only old parts: it goes whole.
        a = [make_record(1, timestamp=OLD), changed(2, **tpu, timestamp=OLD), '{"id": "half']
        old = [
            _put(root, "a", a, OLD),
            _put(root, "c", [make_record(5, timestamp=OLD + 60), _v1("v1-old", OLD)], OLD),
        ]
        _validate(root, self.out)
        # Batch 1 holds new and old parts: it is rewritten. On the cutoff's day, the newest
        # row decides: m's rows stay together, n's go. e was collected late, with old rows.
        b = [make_record(3), changed(4, **tpu), _v1("v1-new", NOW), "not json"]
        m = [make_record(6, timestamp=CUTOFF - 10), make_record(7, timestamp=CUTOFF + 10)]
        e = [make_record(9, timestamp=OLD), changed(10, **tpu, timestamp=OLD), _v1("v1-e", OLD)]
        new = [_put(root, "b", b, NOW - 3600), _put(root, "m", m, CUTOFF)]
        old += [
            _put(root, "n", [make_record(8, timestamp=CUTOFF - 10)], CUTOFF),
            _put(root, "e", e, OLD),
        ]
        _validate(root, self.out)
        old += [
            _put(root, "p-old", [_pair(1, OLD), _pair(2, OLD + 5)], OLD, PAIRS),
            _put(root, "w-old", [_window(OLD)], OLD, ACCEPTANCE),
        ]
        new += [
            _put(root, "p-new", [_pair(3, NOW - 60)], NOW - 60, PAIRS),
            _put(root, "w-new", [_window(NOW - 60)], NOW - 60, ACCEPTANCE),
        ]
        # A whole-store quarantine of validate_store (no date partitions).
        entry = {"source": "x:1", "stage": "parse", "reasons": ["..."]}
        old.append(root / store.QUARANTINE / "part-old.jsonl")
        new.append(root / store.QUARANTINE / "part-new.jsonl")
        old[-1].parent.mkdir()
        old[-1].write_text(json.dumps({**entry, "record": changed(11, timestamp=OLD)}) + "\n")
        new[-1].write_text(json.dumps({**entry, "record": make_record(12)}) + "\n")
        os.utime(old[-1], (OLD, OLD))
        self.old, self.new = old, new
        self.old_keys = {store.part_key(root, p) for p in old}
        self.old_ids = {"req-1", "req-2", "req-5", "v1-old", "req-8", "req-9", "req-10", "v1-e"}

    def ledger(self) -> ledger.Ledger:
        committed = ledger.load_ledger(ledger.folder_of(self.out))
        assert committed is not None
        return committed

    def batch_rows(self) -> list[dict]:
        folder = ledger.folder_of(self.out)
        rows = []
        for batch in self.ledger().batches:
            for path in ledger.batch_files(folder, batch):
                rows += [json.loads(line) for line in path.read_text().splitlines()]
        return rows

    def retain(self, **options):
        return apply_retention(self.root, [self.out], max_age_days=DAYS, now=NOW, **options)

    def assert_retained(self) -> None:
        """The store holds only the new parts, and the ledger and its batches only them."""
        assert not any(p.exists() for p in self.old)
        kept = set(store.part_files(self.root))
        assert {p for p in self.new if p.parent.parent.parent.name == "records"} == kept
        records = {store.part_key(self.root, p) for p in kept}
        assert set(self.ledger().parts()) == records
        sources = {row["source"].rpartition(":")[0] for row in self.batch_rows()}
        assert sources == records  # every kept part has rows in the batches, no old one has
        ids = {row["record"]["id"] for row in self.batch_rows() if isinstance(row["record"], dict)}
        assert not ids & self.old_ids
        # The summaries, recomputed without validating again, are one pass's over the store.
        one_pass = _one_pass(self.root)
        combined = combine_summaries([b.summary for b in self.ledger().batches])
        assert combined == one_pass.summary


@pytest.fixture
def world(tmp_path) -> World:
    return World(tmp_path)


def test_old_parts_and_every_copy_of_them_go_new_ones_stay(world):
    new_content = {p: p.read_bytes() for p in world.new}
    before = _validate(world.root, world.out)  # the dataset files hold old records now
    trained = {r["id"] for name in PARTS for r in _read(world.out / f"{name}.jsonl")}
    assert trained & world.old_ids

    report = world.retain()
    assert report.parts == {"records": 4, PAIRS: 1, ACCEPTANCE: 1, "quarantine": 1}
    assert report.rows == {"records": 9, PAIRS: 2, ACCEPTANCE: 1, "quarantine": 1}
    (dataset,) = report.datasets
    assert (dataset.batches_dropped, dataset.batches_rewritten) == (1, 1)
    assert dataset.copies == 9  # every row of a, c, n and e: valid or quarantined
    assert dataset.dataset_rows > 0
    world.assert_retained()
    assert {p: p.read_bytes() for p in world.new} == new_content  # untouched
    assert [b.number for b in world.ledger().batches] == [2]  # 0 dropped, 1 rewritten as 2
    names = sorted(p.name for p in ledger.folder_of(world.out).iterdir())
    assert names == [
        ".lock",
        "batch-00002-quarantine.jsonl",
        "batch-00002-valid.jsonl",
        "ledger.json",
    ]
    # The dataset files lost the old records already (the next validation rebuilds them).
    for name in PARTS:
        assert not {r["id"] for r in _read(world.out / f"{name}.jsonl")} & world.old_ids
    quarantined = _read(world.out / "quarantine.jsonl")
    assert quarantined and not any(
        e["source"].rpartition(":")[0] in world.old_keys for e in quarantined
    )
    # Emptied partitions are gone (the vLLM areas' hardware folders too); the areas stay.
    old_day = store.partition_dir(world.root, "cpu", OLD)
    assert not old_day.exists() and old_day.parent.is_dir()  # records of newer days remain
    assert not (world.root / PAIRS / "hardware=cpu" / old_day.name).exists()
    assert report.folders == 3
    assert before["validation"]["valid"] > 0


@pytest.mark.slow
def test_incremental_validation_goes_on_after_retention(world, monkeypatch):
    world.retain()
    _put(world.root, "f", [make_record(13), make_record(1)], NOW - 60)  # req-1: gone, so new
    seen = []
    real = validate_incrementally

    def watched(*args, **kwargs):
        result = real(*args, **kwargs)
        seen.append(result.summary)
        return result

    monkeypatch.setattr("tasks.data.curate.validate_incrementally", watched)
    summary = _validate(world.root, world.out)["validation"]  # no ChangedPartError
    assert (summary["mode"], summary["new_parts"], summary["new_rows"]) == ("incremental", 1, 2)
    assert summary["new"]["valid"] == 2  # req-1 is no duplicate: its first copy is gone
    one_pass = _one_pass(world.root)
    expected = one_pass.summary.model_dump(mode="json")
    assert {key: summary[key] for key in expected} == expected
    ids = {r["id"] for name in PARTS for r in _read(world.out / f"{name}.jsonl")}
    assert ids == {"req-1", "req-3", "req-6", "req-7", "v1-new", "req-13"}
    quarantined = _read(world.out / "quarantine.jsonl")
    assert not {e["record"]["id"] for e in quarantined if isinstance(e["record"], dict)} & (
        world.old_ids - {"req-1"}
    )


def test_a_second_run_removes_nothing(world):
    world.retain()
    before = _snapshot(world.root, world.out)
    report = world.retain()
    assert (report.removed, report.parts, report.folders) == ([], {}, 0)
    assert report.datasets[0].copies == report.datasets[0].dataset_rows == 0
    assert _snapshot(world.root, world.out) == before


def test_a_dry_run_changes_nothing_and_says_what_would_go(world, tmp_path):
    _validate(world.root, world.out)
    before = _snapshot(world.root, world.out)
    dry = world.retain(dry_run=True)
    assert _snapshot(world.root, world.out) == before
    assert dry.dry_run and len(dry.removed) == 7
    real = world.retain()
    assert (dry.parts, dry.rows, dry.removed) == (real.parts, real.rows, real.removed)
    assert dry.datasets == real.datasets


def _kill_at(monkeypatch, where: str) -> None:
    """Make the next retention run die at ``where``."""

    def killed(*args, **kwargs):
        raise KeyboardInterrupt(f"killed at {where}")

    if where == "commit":  # the new batch files written, the dataset files filtered
        monkeypatch.setattr(ledger, "save_ledger", killed)
    elif where == "old batches":  # the ledger committed, the superseded files still there
        real = ledger.remove_uncommitted
        calls = []

        def second_call_dies(folder, state):
            calls.append(folder)
            if len(calls) == 2:
                killed()
            return real(folder, state)

        monkeypatch.setattr(ledger, "remove_uncommitted", second_call_dies)
    else:  # "parts": half of the expired parts deleted
        deleted = []

        def delete_some(path):
            if len(deleted) == 3:
                killed()
            deleted.append(path)
            path.unlink()

        monkeypatch.setattr(retention, "_delete", delete_some)


@pytest.mark.slow
@pytest.mark.parametrize("validated_between", [False, True])
@pytest.mark.parametrize("where", ["commit", "old batches", "parts"])
def test_a_killed_run_is_finished_by_the_next(world, monkeypatch, where, validated_between):
    _validate(world.root, world.out)
    with monkeypatch.context() as patched:
        _kill_at(patched, where)
        with pytest.raises(KeyboardInterrupt):
            world.retain()
    if validated_between:
        # The state is consistent at once: a validation neither fails nor loses anything
        # (after the commit, it validates the old parts still there again).
        _validate(world.root, world.out)
    report = world.retain()
    assert report.removed  # what was left
    world.assert_retained()
    assert world.retain().removed == []


def test_rows_without_a_usable_timestamp_age_by_the_parts_mtime(tmp_path):
    root = tmp_path / "store"
    day = NOW - 2 * DAY  # a partition before the cutoff's day: read
    broken = _put(root, "x", ["not json", json.dumps({"id": "no-time"})], day)
    future = _put(root, "y", [make_record(1, timestamp=NOW + 10 * DAY)], day)
    for path in (broken, future):
        os.utime(path, (NOW - 3600, NOW - 3600))  # written recently, for all we know
    assert apply_retention(root, max_age_days=1, now=NOW).removed == []
    for path in (broken, future):
        os.utime(path, (day, day))
    report = apply_retention(root, max_age_days=1, now=NOW)
    assert sorted(report.removed) == sorted(store.part_key(root, p) for p in (broken, future))


def test_partitions_after_the_cutoffs_day_are_not_read(tmp_path, monkeypatch):
    root = tmp_path / "store"
    _put(root, "old", [make_record(1, timestamp=OLD)], OLD)
    _put(root, "new", [make_record(2)], NOW)
    read = []
    real = store.read_parts

    def watched(root, paths):
        paths = list(paths)
        read.extend(p.stem for p in paths)
        return real(root, paths)

    monkeypatch.setattr(store, "read_parts", watched)
    assert len(apply_retention(root, max_age_days=DAYS, now=NOW).removed) == 1
    assert read == ["part-old-00000"]


def test_retention_off_or_on_a_missing_store_removes_nothing(tmp_path, world):
    before = _snapshot(world.root, world.out)
    off = apply_retention(world.root, [world.out], max_age_days=None, now=NOW)
    assert (off.cutoff, off.removed) == (None, [])
    assert _snapshot(world.root, world.out) == before
    assert apply_retention(tmp_path / "none", max_age_days=1, now=NOW).removed == []


@pytest.mark.parametrize("days", [-1, 0, "30", True, float("nan"), float("inf")])
def test_a_bad_age_is_refused_with_its_value(days, tmp_path):
    with pytest.raises(BadInputError, match=f"positive number of days, got {days!r}"):
        apply_retention(tmp_path, max_age_days=days, now=NOW)  # type: ignore[arg-type]


def test_the_store_config(tmp_path):
    assert load_store_config().retention.days == 30  # configs/store.yaml
    path = tmp_path / "store.yaml"
    path.write_text("retention:\n  days: null\n")
    assert load_store_config(path).retention.days is None
    for text, shown in [("-3", "-3"), ("'30'", "'30'"), ("yes", "True")]:
        path.write_text(f"retention:\n  days: {text}\n")
        with pytest.raises(BadInputError, match=f"retention.days: .*got {shown}"):
            load_store_config(path)
    path.write_text("retention:\n  dayz: 3\n")
    with pytest.raises(BadInputError, match=r"retention\.dayz: Extra inputs"):
        load_store_config(path)
    assert check_days(7) == 7.0 and check_days(None) is None


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
