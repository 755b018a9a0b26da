"""Where the front's observations go: write-once JSONL parts in the record store.

Two areas beside the engine's ``records/`` (:mod:`serving.records.store`), partitioned the
same way::

    vllm-pairs/hardware=<target>/date=<day>/part-<run>-<n>.jsonl        request/response ids
    vllm-acceptance/hardware=<target>/date=<day>/part-<run>-<n>.jsonl   scrape windows

Rows are buffered and written as a new part every ``flush_rows`` rows or ``flush_s``
seconds (and on :meth:`PartSink.close`), atomically and never over another writer's part,
so they are versioned with the store (``data.dvc``) like every other part.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from serving.atomic import write_jsonl_atomic
from serving.errors import BadInputError

PAIRS = "vllm-pairs"
ACCEPTANCE = "vllm-acceptance"


def area_parts(root: Path, area: str, hardware: str | None = None) -> list[Path]:
    """Every committed part of ``area`` (of one hardware target), oldest name first."""
    base = Path(root) / area
    if hardware is not None:
        base = base / f"hardware={hardware}"
    if not base.is_dir():
        return []
    return sorted(p for p in base.rglob("part-*.jsonl") if not p.name.startswith("."))


class PartSink:
    def __init__(
        self,
        root: Path,
        area: str,
        *,
        hardware: str,
        run_id: str,
        flush_rows: int = 64,
        flush_s: float = 30.0,
    ) -> None:
        if not hardware or "/" in hardware or "=" in hardware:
            raise BadInputError(f"hardware target {hardware!r} cannot name a partition")
        self.root = Path(root)
        self.area = area
        self.hardware = hardware
        self.run_id = run_id
        self.flush_rows = flush_rows
        self.flush_s = flush_s
        self.written = 0
        self._rows: list[dict[str, Any]] = []
        self._number = 0
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append(row)
            due = len(self._rows) >= self.flush_rows
        if due or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> int:
        with self._lock:
            rows, self._rows = self._rows, []
            self._last_flush = time.monotonic()
            if not rows:
                return 0
            day = datetime.fromtimestamp(rows[0]["timestamp"], tz=UTC).strftime("%Y-%m-%d")
            folder = self.root / self.area / f"hardware={self.hardware}" / f"date={day}"
            while True:
                path = folder / f"part-{self.run_id}-{self._number:05d}.jsonl"
                self._number += 1
                try:
                    count = write_jsonl_atomic(path, rows, exclusive=True)
                    break
                except FileExistsError:
                    continue  # a restarted writer under the same run id: next number
            self.written += count
            return count

    def close(self) -> None:
        self.flush()
