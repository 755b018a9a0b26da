"""The append-only store: tolerant reading, partitions, stale temporaries."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from serving.atomic import write_jsonl_atomic
from serving.errors import BadInputError
from serving.records.schema import RequestRecord, Sampling
from serving.records.store import (
    existing_ids,
    next_part_number,
    part_files,
    part_key,
    partition_dir,
    plan_parts,
    read_parts,
    read_raw,
    remove_stale_temporaries,
    write_part,
)

NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _record(index: int) -> dict:
    """A well-formed record that drafted nothing (the store only checks the schema)."""
    return RequestRecord(
        schema_version=3,
        id=f"req-{index}",
        prompt_id=f"p{index}",
        workload="grounded",
        split="train",
        prompt="x",
        prompt_token_ids=[1, 2],
        output_text="y",
        output_token_ids=[5],
        from_draft=[False],
        acceptance_rate=None,
        mean_accepted_length=1.0,
        draft_tokens=0,
        accepted_tokens=0,
        checks=1,
        steps=[[0, 0]],
        is_failure=False,
        failure_threshold=0.5,
        drafter="pld",
        drafter_version="builtin",
        policy="fixed",
        hardware="cpu",
        sampling=Sampling(temperature=0.0, top_k=0, top_p=1.0, seed=None),
        timestamp=NOW,
        run_id="r",
        disagreements=[],
        drafted=[],
        unverified=[],
    ).model_dump(mode="json")


# -------------------------------------------------------------------------------- reading


def _part(root: Path, name: str = "part-r-00000.jsonl") -> Path:
    return partition_dir(root, "cpu", NOW) / name


def test_read_raw_yields_bad_lines_as_text_and_skips_blank_lines(tmp_path):
    path = _part(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b'{"id": "a"}\n\n{"id": "trunc\n\xff\xfe not utf-8\n[1, 2]\n{"id": "last, no newline"}'
    )
    rows = list(read_raw(tmp_path))
    prefix = "records/hardware=cpu/date=2025-06-15/part-r-00000.jsonl"
    assert rows == [
        (f"{prefix}:1", {"id": "a"}),
        (f"{prefix}:3", '{"id": "trunc'),
        (f"{prefix}:4", "\ufffd\ufffd not utf-8"),
        (f"{prefix}:5", [1, 2]),
        (f"{prefix}:6", {"id": "last, no newline"}),
    ]


def test_read_raw_skips_hidden_temporaries_and_reads_parts_in_order(tmp_path):
    write_jsonl_atomic(_part(tmp_path, "part-r-00001.jsonl"), [{"n": 2}])
    write_jsonl_atomic(_part(tmp_path, "part-r-00000.jsonl"), [{"n": 1}])
    hidden = _part(tmp_path, ".part-r-00002.jsonl.abc123.tmp")
    hidden.write_text('{"n": "half-writ')
    (hidden.parent / ".hidden.jsonl").write_text('{"n": "hidden"}\n')
    later = partition_dir(tmp_path, "cpu", NOW + 86_400.0) / "part-r-00002.jsonl"
    write_jsonl_atomic(later, [{"n": 3}])
    assert [row for _, row in read_raw(tmp_path)] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [p.name for p in part_files(tmp_path)] == [
        "part-r-00000.jsonl",
        "part-r-00001.jsonl",
        "part-r-00002.jsonl",
    ]


def test_reading_a_missing_store_yields_nothing(tmp_path):
    assert list(read_raw(tmp_path / "nope")) == []
    assert part_files(tmp_path / "nope") == []
    assert existing_ids(tmp_path / "nope") == set()


def test_existing_ids_reads_every_readable_version(tmp_path):
    from tests.serving.records.test_schema import V1_LINE

    old = json.loads(V1_LINE)  # an old part, written before drafted tokens were recorded
    write_jsonl_atomic(
        _part(tmp_path),
        [old, _record(1), {**_record(2), "schema_version": 9}, {**_record(3), "checks": "x"}],
    )
    assert existing_ids(tmp_path) == {old["id"], "req-1"}


def test_read_raw_reads_other_areas(tmp_path):
    write_jsonl_atomic(tmp_path / "quarantine" / "part-r.jsonl", [{"q": 1}])
    assert list(read_raw(tmp_path)) == []
    assert list(read_raw(tmp_path, "quarantine")) == [("quarantine/part-r.jsonl:1", {"q": 1})]


# ----------------------------------------------------------------------------- partitions


def test_partition_layout_uses_the_utc_date(tmp_path):
    late = datetime(2025, 6, 15, 23, 59, 59, tzinfo=UTC).timestamp()
    assert partition_dir(tmp_path, "cpu", late) == (
        tmp_path / "records" / "hardware=cpu" / "date=2025-06-15"
    )
    assert partition_dir(tmp_path, "cpu-stock", late + 1).name == "date=2025-06-16"


@pytest.mark.parametrize("hardware", ["", "a/b", "x=y"])
def test_partition_refuses_a_hardware_name_that_cannot_name_a_folder(tmp_path, hardware):
    with pytest.raises(BadInputError, match="cannot name a partition"):
        partition_dir(tmp_path, hardware, NOW)


# ---------------------------------------------------------------------------- existing ids


def test_existing_ids_count_only_well_formed_records(tmp_path):
    broken = _record(2)
    del broken["prompt"]
    write_jsonl_atomic(
        _part(tmp_path), [_record(0), _record(1), broken, {"id": "req-3"}, [1], "text"]
    )
    with _part(tmp_path).open("a") as handle:
        handle.write('{"id": "req-4", "trunc\n')
    assert existing_ids(tmp_path) == {"req-0", "req-1"}


# ---------------------------------------------------------------------- stale temporaries


def test_only_old_temporaries_are_removed(tmp_path):
    folder = partition_dir(tmp_path, "cpu", NOW)
    folder.mkdir(parents=True)
    old = folder / ".part-r-00000.jsonl.aaa.tmp"
    new = folder / ".part-r-00001.jsonl.bbb.tmp"
    visible_old = folder / "part-r-00002.jsonl"
    for path in (old, new, visible_old):
        path.write_text("{}\n")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    os.utime(visible_old, (an_hour_ago, an_hour_ago))
    assert remove_stale_temporaries(tmp_path, older_than_s=600) == 1
    assert not old.exists()
    assert new.exists() and visible_old.exists()
    a_minute_ago = time.time() - 60
    os.utime(new, (a_minute_ago, a_minute_ago))
    assert remove_stale_temporaries(tmp_path, older_than_s=30) == 1
    assert not new.exists()
    assert remove_stale_temporaries(tmp_path / "missing") == 0


def test_rows_become_one_part_per_day_and_numbering_continues(tmp_path):
    day = 86_400.0
    rows = [{"timestamp": NOW}, {"timestamp": NOW + day}, {"timestamp": NOW + 1}]
    planned = plan_parts(tmp_path, "cpu", "r", 3, rows)
    assert [(path.relative_to(tmp_path).as_posix(), len(part)) for path, part in planned] == [
        ("records/hardware=cpu/date=2025-06-15/part-r-00003.jsonl", 2),
        ("records/hardware=cpu/date=2025-06-16/part-r-00004.jsonl", 1),
    ]
    assert next_part_number(tmp_path, "r") == 0  # nothing written yet
    for path, part in planned:
        write_jsonl_atomic(path, part)
    assert next_part_number(tmp_path, "r") == 5
    assert next_part_number(tmp_path, "other") == 0


# ------------------------------------------------------------------------ write-once parts


def test_a_part_is_never_written_over(tmp_path):
    path = _part(tmp_path)
    assert write_part(path, [_record(0)]) == 1
    with pytest.raises(FileExistsError, match=f"{path} already exists: refusing to replace it"):
        write_part(path, [_record(1)])
    assert [row["id"] for _, row in read_raw(tmp_path)] == ["req-0"]
    assert sorted(os.listdir(path.parent)) == [path.name]  # no temporary left behind
    assert _mode(path) == 0o644


def test_write_once_holds_without_hard_links(tmp_path, monkeypatch):
    """Where os.link is not supported (FAT, some network mounts), an O_EXCL claim stands in."""

    def no_links(source, target):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr("serving.atomic.os.link", no_links)
    path = _part(tmp_path)
    assert write_part(path, [_record(0)]) == 1
    with pytest.raises(FileExistsError, match="already exists"):
        write_part(path, [_record(1)])
    other = _part(tmp_path, "part-r-00001.jsonl")
    claim = other.with_name(f".{other.name}.claim.tmp")
    claim.touch()  # another writer is putting this very name in place
    with pytest.raises(FileExistsError, match="being put in place by another writer"):
        write_part(other, [_record(2)])
    claim.unlink()
    assert write_part(other, [_record(2)]) == 1
    assert [row["id"] for _, row in read_raw(tmp_path)] == ["req-0", "req-2"]
    assert sorted(os.listdir(path.parent)) == [path.name, other.name]


def test_read_parts_reads_only_the_parts_named(tmp_path):
    first, second = _part(tmp_path), _part(tmp_path, "part-r-00001.jsonl")
    write_part(first, [{"n": 1}])
    write_part(second, [{"n": 2}, {"n": 3}])
    key = part_key(tmp_path, second)
    assert key == "records/hardware=cpu/date=2025-06-15/part-r-00001.jsonl"
    assert list(read_parts(tmp_path, [second])) == [(f"{key}:1", {"n": 2}), (f"{key}:2", {"n": 3})]
