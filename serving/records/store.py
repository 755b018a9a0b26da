"""An append-only, partitioned JSONL store with atomic writes.

Layout under a root::

    records/hardware=<target>/date=<YYYY-MM-DD>/part-<run>-<seq>.jsonl   collected requests
    quarantine/part-<run>.jsonl                                           rejected rows + reasons

A part is written to a hidden temporary file beside its final name and renamed into place,
(:mod:`serving.atomic`), so a reader never sees a half-written part and a killed writer
leaves only a hidden ``.tmp`` file that readers skip and the next run removes. Parts are
never modified.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from serving.errors import BadInputError

RECORDS = "records"
QUARANTINE = "quarantine"


def partition_dir(root: Path, hardware: str, when: float) -> Path:
    if not hardware or "/" in hardware or "=" in hardware:
        raise BadInputError(f"hardware target {hardware!r} cannot name a partition")
    day = datetime.fromtimestamp(when, tz=UTC).strftime("%Y-%m-%d")
    return Path(root) / RECORDS / f"hardware={hardware}" / f"date={day}"


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


def read_raw(root: Path, area: str = RECORDS) -> Iterator[tuple[str, object]]:
    """Yield ``(source, row)`` for every line of every part; a line that is not JSON (or not
    UTF-8) is yielded as its text so that validation quarantines it rather than crash. Blank
    lines carry nothing and are skipped."""
    for path in part_files(root, area):
        for number, line in read_lines(path):
            source = f"{path.relative_to(root)}:{number}"
            if isinstance(line, bytes):
                yield source, line.decode("utf-8", errors="replace").rstrip("\n")
                continue
            if not line.strip():
                continue
            try:
                yield source, json.loads(line)
            except json.JSONDecodeError:
                yield source, line.rstrip("\n")


def existing_ids(root: Path) -> set[str]:
    """Ids of the well-formed records already stored (a malformed copy does not count, so a
    re-run of collection replaces it with a good one)."""
    from pydantic import ValidationError

    from serving.records.schema import RequestRecord

    ids: set[str] = set()
    for _, row in read_raw(root):
        if isinstance(row, dict):
            try:
                ids.add(RequestRecord.model_validate(row).id)
            except ValidationError:
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
