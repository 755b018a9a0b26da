"""Atomic writes: the one way specops puts a file or a folder on disk.

Everything is written to a hidden temporary beside its final name (same file system, so
the rename is atomic), flushed and fsynced, then renamed into place; on any error the
temporary is removed. A reader sees the old content or the new, never half of either; a
killed writer leaves only a hidden ``.<name>.*.tmp`` that readers skip.

- :func:`atomic_path` hands out the temporary *path* for writers that take one
  (``torch.save``, ``safetensors.save_file``, ``save_pretrained``); with
  ``exclusive=True`` it never replaces an existing file (:func:`link_into_place`), for
  append-only stores that several writers share;
- :func:`atomic_writer` opens it as a text file; :func:`write_text_atomic`,
  :func:`write_json_atomic` and :func:`write_jsonl_atomic` are the usual cases;
- :func:`atomic_dir` does the same for a folder; :func:`replace_dir` puts a finished
  folder in place of another; :func:`recover_dir` and :func:`remove_scratch` tidy up
  after a writer that was killed outright, for a folder that one owner writes.
"""

from __future__ import annotations

import errno
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


# What os.link raises on a file system without hard links (FAT, some FUSE/SMB mounts).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _refuse(path: Path, why: str) -> FileExistsError:
    return FileExistsError(
        errno.EEXIST,
        f"{path} {why}: refusing to replace it (files here are written once; "
        "write under a new name)",
        str(path),
    )


def link_into_place(temporary: Path, path: Path) -> None:
    """Move the finished ``temporary`` to ``path`` unless ``path`` already exists, in which
    case raise :class:`FileExistsError` naming it and leave both files as they are.

    A hard link is created atomically and fails on an existing name, so of two writers
    racing for one name exactly one wins and neither clobbers the other (``os.replace``
    would let the second silently win). Where the file system has no hard links, a hidden
    ``.<name>.claim.tmp`` made with ``O_EXCL`` serialises the writers instead, and the
    rename happens only if ``path`` is still free."""
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise _refuse(path, "already exists") from None
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
        _claim_and_rename(temporary, path)
        return
    temporary.unlink()


def _claim_and_rename(temporary: Path, path: Path) -> None:
    claim = path.with_name(f".{path.name}.claim.tmp")  # hidden: readers skip it
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        raise _refuse(path, "is being put in place by another writer") from None
    try:
        if path.exists():
            raise _refuse(path, "already exists")
        os.replace(temporary, path)
    finally:
        claim.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path, *, exclusive: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary path beside ``path``; when the block ends without error,
    fsync what was written there and rename it to ``path`` (readable by everyone).

    ``exclusive``: an existing ``path`` is an error (:func:`link_into_place`), not replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        _fsync(temporary)
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a server may run as another user
        if exclusive:
            link_into_place(temporary, path)
        else:
            os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_writer(path: str | Path, *, exclusive: bool = False) -> Iterator[TextIO]:
    """Open a hidden temporary beside ``path`` for writing text (UTF-8); on success it
    replaces ``path`` (``exclusive``: takes its place only if there is none), on any error
    it is deleted."""
    with (
        atomic_path(path, exclusive=exclusive) as temporary,
        temporary.open("w", encoding="utf-8") as handle,
    ):
        yield handle


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_writer(path) as handle:
        handle.write(text)


def write_json_atomic(path: str | Path, payload: object) -> None:
    """Write one JSON document atomically."""
    with atomic_writer(path) as handle:
        json.dump(payload, handle, indent=2)


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict], *, exclusive: bool = False) -> int:
    """Write ``rows`` as JSON lines atomically; return the row count. ``exclusive``: never
    replace an existing ``path`` (:class:`FileExistsError` instead)."""
    count = 0
    with atomic_writer(path, exclusive=exclusive) as handle:
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
