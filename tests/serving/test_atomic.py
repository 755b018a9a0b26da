"""Atomic writes (serving/atomic.py): all or nothing, world-readable, nothing left behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from serving.atomic import (
    atomic_dir,
    atomic_path,
    recover_dir,
    remove_scratch,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_jsonl_write_is_readable_and_world_readable(tmp_path):
    path = tmp_path / "deep" / "folder" / "part.jsonl"
    rows = [{"a": 1}, {"b": [1, 2]}, {"c": "é"}]
    assert write_jsonl_atomic(path, rows) == 3
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    assert _mode(path) == 0o644
    assert sorted(os.listdir(path.parent)) == ["part.jsonl"]


def test_empty_jsonl_write(tmp_path):
    assert write_jsonl_atomic(tmp_path / "empty.jsonl", iter(())) == 0
    assert (tmp_path / "empty.jsonl").read_text() == ""


def test_json_write_is_readable_and_world_readable(tmp_path):
    path = tmp_path / "summary.json"
    payload = {"total": 3, "nested": {"rate": None}}
    write_json_atomic(path, payload)
    assert json.loads(path.read_text()) == payload
    assert _mode(path) == 0o644
    write_json_atomic(path, {"total": 4})  # replacing works too
    assert json.loads(path.read_text()) == {"total": 4}


def _rows_then(error: BaseException):
    yield {"row": 1}
    yield {"row": 2}
    raise error


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_interrupted_write_leaves_nothing_new(tmp_path, error):
    fresh = tmp_path / "fresh.jsonl"
    with pytest.raises(type(error)):
        write_jsonl_atomic(fresh, _rows_then(error))
    assert not fresh.exists()
    assert os.listdir(tmp_path) == []  # no temporary left behind


def test_interrupted_write_keeps_the_previous_content(tmp_path):
    path = tmp_path / "part.jsonl"
    write_jsonl_atomic(path, [{"old": True}])
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        write_jsonl_atomic(path, _rows_then(RuntimeError("killed")))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["part.jsonl"]


def test_unserialisable_row_aborts_the_write(tmp_path):
    path = tmp_path / "part.jsonl"
    with pytest.raises(TypeError):
        write_jsonl_atomic(path, [{"ok": 1}, {"bad": object()}])
    assert os.listdir(tmp_path) == []


def test_text_write_replaces_and_is_utf8(tmp_path):
    path = tmp_path / "note.md"
    write_text_atomic(path, "old")
    write_text_atomic(path, "naïve")
    assert path.read_text(encoding="utf-8") == "naïve"
    assert os.listdir(tmp_path) == ["note.md"]


def test_atomic_path_hands_a_temporary_that_becomes_the_file(tmp_path):
    path = tmp_path / "weights.bin"
    with atomic_path(path) as temporary:
        assert temporary.parent == tmp_path and temporary.name.startswith(".weights.bin.")
        temporary.write_bytes(b"\x00\x01")
        assert not path.exists()  # nothing visible until the block ends
    assert path.read_bytes() == b"\x00\x01"
    assert _mode(path) == 0o644
    assert os.listdir(tmp_path) == ["weights.bin"]


def test_atomic_path_failure_keeps_the_old_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(path) as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("killed")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["weights.bin"]


def test_atomic_dir_replaces_a_folder_whole(tmp_path):
    folder = tmp_path / "model"
    with atomic_dir(folder) as scratch:
        (scratch / "a.txt").write_text("1")
    with atomic_dir(folder) as scratch:
        (scratch / "b.txt").write_text("2")
        assert (folder / "a.txt").exists()  # the old one serves until the new one is whole
    assert sorted(os.listdir(folder)) == ["b.txt"]
    assert _mode(folder) == 0o755
    assert os.listdir(tmp_path) == ["model"]


def test_atomic_dir_failure_keeps_the_old_folder(tmp_path):
    folder = tmp_path / "model"
    with atomic_dir(folder) as scratch:
        (scratch / "a.txt").write_text("1")
    with pytest.raises(KeyboardInterrupt), atomic_dir(folder) as scratch:
        (scratch / "b.txt").write_text("2")
        raise KeyboardInterrupt
    assert os.listdir(folder) == ["a.txt"]
    assert os.listdir(tmp_path) == ["model"]


def test_a_writer_killed_between_the_renames_leaves_a_recoverable_folder(tmp_path):
    folder = tmp_path / "checkpoint"
    with atomic_dir(folder) as scratch:
        (scratch / "a.txt").write_text("1")
    os.replace(folder, tmp_path / ".checkpoint.old")  # what replace_dir's first rename does
    assert recover_dir(folder)
    assert os.listdir(folder) == ["a.txt"]
    assert not recover_dir(folder)  # nothing to do when the folder is there


def test_remove_scratch_clears_what_a_killed_writer_left(tmp_path):
    folder = tmp_path / "checkpoint"
    (tmp_path / ".checkpoint.abc.tmp").mkdir()
    (tmp_path / ".checkpoint.abc.tmp" / "half.bin").write_bytes(b"x")
    (tmp_path / ".checkpoint.def.tmp").write_bytes(b"y")
    (tmp_path / ".other.abc.tmp").write_bytes(b"not ours")
    assert remove_scratch(folder) == 2
    assert os.listdir(tmp_path) == [".other.abc.tmp"]
