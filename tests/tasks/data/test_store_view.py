"""The store as ``collect``'s steps read it: the view validation leaves (the validated
records of one hardware target and, on a vLLM target, its scraped windows, read once), and
the full reader of every record that parses."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from serving.gateway.sink import ACCEPTANCE
from serving.hardware import hardware_target
from serving.records import store as record_store
from tasks.data.curate import curate_records
from tasks.data.store_view import StoreView, read_valid_records
from tests.tasks.data.test_validate import make_record
from tests.tasks.data.test_vllm_acceptance import row, write_windows


def _write(root: Path, rows: list[dict], run_id: str) -> None:
    first = rows[0]
    folder = record_store.partition_dir(root, first["hardware"], first["timestamp"])
    record_store.write_part(folder / record_store.part_name(run_id, 0), rows)


@pytest.fixture
def curated(tmp_path):
    """A store of three good cpu records (two served by ``d/1``), one cpu record a week
    ahead (it parses; Great Expectations quarantines it) and one cuda record, validated."""
    now = time.time()
    good = [
        make_record(i, timestamp=now - 60 + i, drafter_version="d/1" if i < 2 else "d/2")
        for i in range(3)
    ]
    ahead = make_record(3, timestamp=now + 7 * 86_400, drafter_version="d/1")
    _write(tmp_path / "store", [*good, ahead], "cpu")
    _write(tmp_path / "store", [make_record(4, timestamp=now - 30, hardware="cuda")], "cuda")
    return curate_records(tmp_path / "store", tmp_path / "dataset")


def test_the_view_holds_its_targets_validated_records_only(tmp_path, curated):
    store = tmp_path / "store"
    view = StoreView.of(store, hardware_target("cpu"), curated.valid)
    assert [r.id for r in view.records] == ["req-0", "req-1", "req-2"]
    assert [r.id for r in view.served_by("d/1")] == ["req-0", "req-1"]
    assert view.served_by(None) == list(view.records)
    assert view.root == store and view.windows == () and view.scraped(None, window=1) == []
    # The row a day ahead parses, so the full reader keeps it; validation quarantined it.
    assert curated.summary.validation.by_stage["expectations"] == 1
    assert "req-3" in {r.id for r in read_valid_records(store, hardware_name="cpu")}
    cuda = StoreView.of(store, hardware_target("cuda"), curated.valid)
    assert [r.id for r in cuda.records] == ["req-4"]


def test_on_a_vllm_target_the_view_reads_the_scraped_windows_once(tmp_path, monkeypatch):
    write_windows(tmp_path, [row(1.0, "a/1", 30, 100, 60), row(2.0, "b/2", 6, 100, 30)])
    parts = sorted((tmp_path / ACCEPTANCE).rglob("part-*.jsonl"))
    reads: list[Path] = []
    real = Path.read_text

    def read_text(path: Path, *args, **kwargs) -> str:
        reads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    view = StoreView.of(tmp_path, hardware_target("cpu-vllm"), [])
    assert sorted(reads) == parts and len(view.windows) == 2
    [newest] = view.scraped("b/2", window=4)  # the watch's window
    assert (newest.requests, newest.acceptance) == (6, 0.3)
    [every] = view.scraped(None, window=50)  # the trigger's, before any champion
    assert (every.requests, every.draft_tokens, every.accepted_tokens) == (36, 200, 90)
    assert sorted(reads) == parts  # nothing read again
    assert StoreView.of(tmp_path, hardware_target("cpu"), []).windows == ()  # not vLLM
    assert sorted(reads) == parts
