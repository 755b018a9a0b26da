"""Incremental validation: only new parts are validated, earlier verdicts are kept, and the
result is what one run over the whole store gives.

Great Expectations is watched through ``tasks.data.validate.expectation_reasons``, so each
test can say which records a run sent through the suites.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from serving.errors import BadInputError
from serving.records import store
from serving.records.schema import RequestRecord
from tasks.data import ledger
from tasks.data import validate as validate_module
from tasks.data.incremental import validate_incrementally
from tasks.data.ledger import ChangedPartError
from tasks.data.validate import validate_records
from tasks.data.validation_summary import ValidationSummary
from tests.tasks.data.test_validate import NOW, changed, make_record

HARDWARE = ("cpu", "cuda")


@pytest.fixture
def suite_ids(monkeypatch) -> list[list[str]]:
    """The record ids each Great Expectations run saw, one list per run."""
    runs: list[list[str]] = []
    real = validate_module.expectation_reasons

    def watched(records, **options):
        runs.append([record.id for record in records])
        return real(records, **options)

    monkeypatch.setattr(validate_module, "expectation_reasons", watched)
    return runs


def _put(root: Path, name: str, rows: list) -> Path:
    """A committed part of ``rows`` (a ``str`` row is written as a raw, broken line)."""
    path = store.partition_dir(root, "cpu", NOW) / f"part-{name}-00000.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _run(root: Path, out: Path, *, hardware=HARDWARE, full: bool = False):
    with ledger.exclusive(ledger.folder_of(out)):
        return validate_incrementally(root, out, known_hardware=hardware, full=full, now=NOW)


def _one_pass(root: Path, hardware=HARDWARE):
    """What validating the whole store at once gives."""
    return validate_records(store.read_raw(root), known_hardware=hardware, now=NOW)


def _ids(rows: list[RequestRecord]) -> list[str]:
    return [row.id for row in rows]


def _folder_names(out: Path) -> list[str]:
    return sorted(p.name for p in ledger.folder_of(out).iterdir())


@pytest.fixture
def store_root(tmp_path) -> Path:
    """Two parts: three good records, one from unknown hardware, one broken line."""
    root = tmp_path / "store"
    _put(root, "a", [make_record(1), make_record(2), '{"id": "half'])
    _put(root, "b", [make_record(3), changed(4, hardware="tpu")])
    return root


def test_a_second_run_validates_only_the_new_parts(tmp_path, store_root, suite_ids):
    out = tmp_path / "out"
    first = _run(store_root, out)
    assert suite_ids == [["req-1", "req-2", "req-3", "req-4"]]
    assert (first.summary.mode, first.summary.full_reason) == ("full", "no ledger yet")
    assert (first.summary.new_parts, first.summary.new_rows) == (2, 5)
    assert (first.summary.valid, first.summary.quarantined) == (3, 2)

    _put(store_root, "c", [make_record(5), make_record(0)])  # sorts after a and b
    second = _run(store_root, out)
    assert suite_ids[1:] == [["req-5", "req-0"]]  # only the new part's records
    assert second.summary.mode == "incremental" and second.summary.full_reason is None
    assert (second.summary.parts, second.summary.new_parts) == (3, 1)
    assert second.summary.new_rows == second.summary.new.total == 2
    # Totals, rows and their order are those of one pass over the whole store.
    one_pass = _one_pass(store_root)
    totals = second.summary.model_dump(include=set(ValidationSummary.model_fields))
    assert totals == one_pass.summary.model_dump()
    assert second.valid == one_pass.valid
    assert second.quarantined == one_pass.quarantined

    committed = (ledger.folder_of(out) / ledger.LEDGER).read_bytes()
    runs = len(suite_ids)  # the one pass above ran the suites too
    third = _run(store_root, out)  # nothing new: no suite runs, the ledger is left as it was
    assert len(suite_ids) == runs
    assert (third.summary.new_parts, third.summary.new_rows) == (0, 0)
    assert not any(suite.ran for suite in third.summary.new.suites.values())
    assert third.summary.total == 7 and third.valid == one_pass.valid
    assert (ledger.folder_of(out) / ledger.LEDGER).read_bytes() == committed
    assert _folder_names(out) == [
        ".lock",
        "batch-00000-quarantine.jsonl",
        "batch-00000-valid.jsonl",
        "batch-00001-quarantine.jsonl",
        "batch-00001-valid.jsonl",
        "ledger.json",
    ]


def test_an_id_seen_in_an_earlier_run_is_a_duplicate_in_a_later_one(tmp_path, store_root):
    out = tmp_path / "out"
    _run(store_root, out)
    # req-1 was accepted, req-4 parsed but failed its expectations: both count as seen.
    _put(store_root, "c", [make_record(1), changed(4, hardware="tpu"), make_record(6)])
    result = _run(store_root, out)
    new = result.summary.new
    assert (new.valid, new.by_stage["duplicate"]) == (1, 2)
    duplicates = [e for e in result.quarantined if e["stage"] == "duplicate"]
    a, b = (store.part_key(store_root, p) for p in store.part_files(store_root)[:2])
    assert [e["reasons"] for e in duplicates] == [
        ["duplicate id req-1 (first at " + a + ":1)"],
        ["duplicate id req-4 (first at " + b + ":2)"],
    ]
    assert _ids(result.valid).count("req-1") == 1
    assert result.quarantined == _one_pass(store_root).quarantined


def test_a_changed_or_missing_part_is_an_error_naming_it(tmp_path, store_root, suite_ids):
    out = tmp_path / "out"
    _run(store_root, out)
    part = store.part_files(store_root)[0]
    key = store.part_key(store_root, part)

    later = part.stat().st_mtime_ns + 5_000_000_000
    os.utime(part, ns=(later, later))  # touched, same bytes: fine, and the ledger notes it
    assert _run(store_root, out).summary.new_parts == 0
    recorded = ledger.load_ledger(ledger.folder_of(out)).batches[0].parts[key]  # type: ignore[union-attr]
    assert recorded.mtime_ns == later

    original = part.read_bytes()
    part.write_bytes(original.replace(b'"req-1"', b'"req-9"'))  # same size, new content
    with pytest.raises(ChangedPartError, match=f"part {key} under .* changed since batch-00000"):
        _run(store_root, out)
    part.write_bytes(original + b"\n")
    with pytest.raises(ChangedPartError, match=r"size \d+ -> \d+"):
        _run(store_root, out)
    moved = part.rename(tmp_path / "aside.jsonl")
    with pytest.raises(ChangedPartError, match=f"part {key} .* is gone"):
        _run(store_root, out)
    assert len(suite_ids) == 1  # refused before validating anything

    # The documented way out: re-validate everything.
    moved.rename(part)
    part.write_bytes(original.replace(b'"req-1"', b'"req-9"'))
    result = _run(store_root, out, full=True)
    assert result.summary.mode == "full"
    assert result.summary.full_reason == "asked for (full=True)"
    assert "req-9" in _ids(result.valid) and "req-1" not in _ids(result.valid)


@pytest.mark.slow
def test_a_run_killed_before_its_ledger_is_written_is_repaired(tmp_path, store_root, monkeypatch):
    out = tmp_path / "out"
    _run(store_root, out)
    _put(store_root, "c", [make_record(5), make_record(6)])

    def killed(folder, state):
        raise KeyboardInterrupt("killed between the batch files and the ledger")

    with monkeypatch.context() as patched:
        patched.setattr(ledger, "save_ledger", killed)
        with pytest.raises(KeyboardInterrupt):
            _run(store_root, out)
    assert "batch-00001-valid.jsonl" in _folder_names(out)  # written, not committed
    assert len(ledger.load_ledger(ledger.folder_of(out)).batches) == 1  # type: ignore[union-attr]

    _put(store_root, "d", [make_record(7)])  # more traffic arrived meanwhile
    result = _run(store_root, out)
    assert (result.summary.new_parts, result.summary.new_rows) == (2, 3)
    assert _ids(result.valid) == _ids(_one_pass(store_root).valid)  # none lost, none twice
    assert len(set(_ids(result.valid))) == len(result.valid) == 6
    batch = ledger.folder_of(out) / "batch-00001-valid.jsonl"
    assert len(batch.read_text().splitlines()) == 3  # rewritten whole, not appended to


def test_changed_rules_revalidate_everything(tmp_path, store_root, suite_ids):
    out = tmp_path / "out"
    assert _ids(_run(store_root, out, hardware=["cpu"]).valid) == ["req-1", "req-2", "req-3"]
    result = _run(store_root, out, hardware=["cpu", "tpu"])
    assert result.summary.mode == "full"
    assert result.summary.full_reason == "the validation rules changed (known_hardware)"
    assert _ids(result.valid) == ["req-1", "req-2", "req-3", "req-4"]
    assert len(suite_ids) == 2 and len(suite_ids[1]) == 4
    # The superseded batch is gone once the new ledger is committed; numbering went on.
    assert [n for n in _folder_names(out) if n.startswith("batch-")] == [
        "batch-00001-quarantine.jsonl",
        "batch-00001-valid.jsonl",
    ]


def test_an_unreadable_ledger_is_an_error_unless_revalidating(tmp_path, store_root):
    out = tmp_path / "out"
    _run(store_root, out)
    path = ledger.folder_of(out) / ledger.LEDGER
    path.write_text("{not json")
    with pytest.raises(BadInputError, match=f"cannot read the validation ledger {path}.*full=True"):
        _run(store_root, out)
    assert _run(store_root, out, full=True).summary.valid == 3
    assert json.loads(path.read_text())["format"] == ledger.LEDGER_FORMAT


def test_one_run_at_a_time_per_dataset_folder(tmp_path):
    folder = ledger.folder_of(tmp_path / "out")
    entered = threading.Event()

    def second_run() -> None:
        with ledger.exclusive(folder):
            entered.set()

    with ledger.exclusive(folder):
        waiting = threading.Thread(target=second_run)
        waiting.start()
        assert not entered.wait(0.3)  # blocked while the first holds the lock
    waiting.join(5)
    assert entered.is_set()
