"""An append-only, partitioned JSONL store with atomic writes.

Layout under a root::

    records/hardware=<target>/date=<YYYY-MM-DD>/part-<run>-<seq>.jsonl   collected requests
    quarantine/part-<run>.jsonl                                           rejected rows + reasons

A part is written to a hidden temporary file beside its final name and linked into place
(:func:`write_part`, :mod:`serving.atomic`), so a reader never sees a half-written part and a
killed writer leaves only a hidden ``.tmp`` file that readers skip and the next run removes.
Parts are never modified, and never replaced: several writers (server replicas on other
hosts, collections) share one store, each under its own run id, and a part whose name is
already taken is refused rather than overwritten, so no writer can lose another's records.
Readers may rely on this: a part, once seen, keeps its content (the incremental validation
of :mod:`tasks.data.incremental` does).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from serving.atomic import write_jsonl_atomic
from serving.errors import BadInputError
from serving.records.schema import UnknownSchemaVersionError, parse_record

RECORDS = "records"
QUARANTINE = "quarantine"


def partition_dir(root: Path, hardware_name: str, when: float, area: str = RECORDS) -> Path:
    """The folder of ``area``'s partition ``hardware=<hardware_name>/date=<day of when>``
    (a stored key: the name records carry, not necessarily a target of today's
    ``configs/hardware.yaml``)."""
    if not hardware_name or "/" in hardware_name or "=" in hardware_name:
        raise BadInputError(f"hardware target {hardware_name!r} cannot name a partition")
    day = datetime.fromtimestamp(when, tz=UTC).strftime("%Y-%m-%d")
    return Path(root) / area / f"hardware={hardware_name}" / f"date={day}"


def part_name(run_id: str, number: int) -> str:
    return f"part-{run_id}-{number:05d}.jsonl"


def next_part_number(root: Path, run_id: str) -> int:
    """The first part number ``run_id`` has not used under ``root`` (a re-run continues)."""
    prefix = f"part-{run_id}-"
    numbers = [
        int(p.stem[len(prefix) :])
        for p in part_files(root)
        if p.stem.startswith(prefix) and p.stem[len(prefix) :].isdigit()
    ]
    return max(numbers, default=-1) + 1


def plan_parts(
    root: Path, hardware_name: str, run_id: str, first: int, rows: list[dict], area: str = RECORDS
) -> list[tuple[Path, list[dict]]]:
    """``rows`` as new parts of ``area`` under ``hardware=<hardware_name>``, one per
    partition (the day of each row's ``timestamp``), numbered from ``first`` in order; the
    caller writes each and moves past all of them."""
    by_partition: dict[Path, list[dict]] = {}
    for row in rows:
        directory = partition_dir(root, hardware_name, row["timestamp"], area)
        by_partition.setdefault(directory, []).append(row)
    return [
        (directory / part_name(run_id, first + index), part_rows)
        for index, (directory, part_rows) in enumerate(by_partition.items())
    ]


def write_part(path: Path, rows: Iterable[dict]) -> int:
    """Write a new part atomically and return its row count; a part already at ``path`` is
    a :class:`FileExistsError` naming it (parts are write-once: another writer's part is
    never replaced, see :func:`serving.atomic.link_into_place`)."""
    return write_jsonl_atomic(path, rows, exclusive=True)


def part_files(root: Path, area: str = RECORDS) -> list[Path]:
    """Every committed part under ``root/area`` (hidden temporary files excluded), sorted."""
    base = Path(root) / area
    if not base.is_dir():
        return []
    return sorted(p for p in base.rglob("*.jsonl") if not p.name.startswith("."))


def read_lines(path: Path) -> Iterator[tuple[int, str | bytes]]:
    """Yield ``(line number, text)``; a line that is not UTF-8 is yielded as its bytes."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError:
                yield number, raw


def part_key(root: Path, path: Path) -> str:
    """``path`` relative to the store ``root``, with ``/``: how a part is named in sources
    and ledgers, the same on every host that mounts the store."""
    return Path(path).relative_to(root).as_posix()


def read_parts(root: Path, paths: Iterable[Path]) -> Iterator[tuple[str, object]]:
    """Yield ``(source, row)`` for every line of the parts ``paths`` (under ``root``), as
    :func:`read_raw` does for all of them."""
    for path in paths:
        for number, line in read_lines(path):
            source = f"{part_key(root, path)}:{number}"
            if isinstance(line, bytes):
                yield source, line.decode("utf-8", errors="replace").rstrip("\n")
                continue
            if not line.strip():
                continue
            try:
                yield source, json.loads(line)
            except json.JSONDecodeError:
                yield source, line.rstrip("\n")


def read_raw(root: Path, area: str = RECORDS) -> Iterator[tuple[str, object]]:
    """Yield ``(source, row)`` for every line of every part; a line that is not JSON (or not
    UTF-8) is yielded as its text so that validation quarantines it rather than crash. Blank
    lines carry nothing and are skipped."""
    yield from read_parts(root, part_files(root, area))


def existing_ids(root: Path) -> set[str]:
    """Ids of the well-formed records already stored, of any readable schema version (a
    malformed copy does not count, so a re-run of collection replaces it with a good one)."""
    ids: set[str] = set()
    for _, row in read_raw(root):
        if isinstance(row, dict):
            try:
                ids.add(parse_record(row).id)
            except (ValidationError, UnknownSchemaVersionError):
                continue
    return ids


def remove_stale_temporaries(root: Path, *, older_than_s: float = 600.0) -> int:
    """Delete hidden ``.tmp`` parts a killed writer left behind (only old ones, so that a
    writer still running is never disturbed); return how many."""
    removed = 0
    base = Path(root)
    if base.is_dir():
        cutoff = time.time() - older_than_s
        for path in base.rglob(".*.tmp"):
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
    return removed
