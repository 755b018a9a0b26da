"""Atomic writes: the one way specops puts a file or a folder on disk.

Everything is written to a hidden temporary beside its final name (same file system, so
the rename is atomic), flushed and fsynced, then renamed into place; on any error the
temporary is removed. A reader sees the old content or the new, never half of either; a
killed writer leaves only a hidden ``.<name>.*.tmp`` that readers skip.

- :func:`atomic_path` hands out the temporary *path* for writers that take one
  (``torch.save``, ``safetensors.save_file``, ``save_pretrained``);
- :func:`atomic_writer` opens it as a text file; :func:`write_text_atomic`,
  :func:`write_json_atomic` and :func:`write_jsonl_atomic` are the usual cases;
- :func:`atomic_dir` does the same for a folder; :func:`replace_dir` puts a finished
  folder in place of another; :func:`recover_dir` and :func:`remove_scratch` tidy up
  after a writer that was killed outright, for a folder that one owner writes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_tree(folder: Path) -> None:
    for parent, _, names in os.walk(folder):
        for name in names:
            _fsync(Path(parent) / name)


def _old(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}.old")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a hidden temporary path beside ``path``; when the block ends without error,
    fsync what was written there and rename it to ``path`` (readable by everyone)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        _fsync(temporary)
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a server may run as another user
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[TextIO]:
    """Open a hidden temporary beside ``path`` for writing text (UTF-8); on success it
    replaces ``path``, on any error it is deleted."""
    with atomic_path(path) as temporary, temporary.open("w", encoding="utf-8") as handle:
        yield handle


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_writer(path) as handle:
        handle.write(text)


def write_json_atomic(path: str | Path, payload: object) -> None:
    """Write one JSON document atomically."""
    with atomic_writer(path) as handle:
        json.dump(payload, handle, indent=2)


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> int:
    """Write ``rows`` as JSON lines atomically; return the row count."""
    count = 0
    with atomic_writer(path) as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
            count += 1
    return count


def replace_dir(source: Path, folder: Path) -> None:
    """Put the finished folder ``source`` (on ``folder``'s file system) at ``folder``. An
    existing ``folder`` is first renamed aside and removed only after the new one is in
    place, so a crash between the two renames leaves ``.<name>.old``, never nothing."""
    folder = Path(folder)
    if not folder.exists():
        os.replace(source, folder)
        return
    old = _old(folder)
    shutil.rmtree(old, ignore_errors=True)
    os.replace(folder, old)
    os.replace(source, folder)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_dir(folder: str | Path) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``folder``; when the block ends without
    error it replaces ``folder`` (:func:`replace_dir`), on any error it is removed."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        yield scratch
        _fsync_tree(scratch)
        scratch.chmod(0o755)  # mkdtemp makes it 0700; a server may run as another user
        replace_dir(scratch, folder)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def recover_dir(folder: str | Path) -> bool:
    """Put back the previous ``folder`` when a writer died between :func:`replace_dir`'s two
    renames (only ``.<name>.old`` is left); True if it did."""
    folder = Path(folder)
    old = _old(folder)
    if folder.exists() or not old.is_dir():
        return False
    os.replace(old, folder)
    return True


def remove_scratch(folder: str | Path) -> int:
    """Remove the hidden temporaries a killed :func:`atomic_dir` or :func:`atomic_path`
    left beside ``folder`` (``.<name>.*.tmp``); return how many. Only for a folder whose
    one writer is the caller: a writer still running would lose its temporary."""
    folder = Path(folder)
    removed = 0
    for scratch in folder.parent.glob(f".{folder.name}.*.tmp"):
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            scratch.unlink(missing_ok=True)
        removed += 1
    return removed
