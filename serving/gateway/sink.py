"""Where the front's observations go: write-once JSONL parts in the record store.

Two areas beside the engine's ``records/``, partitioned and named the same way
(:mod:`serving.records.store`: ``plan_parts``, ``write_part``)::

    vllm-pairs/hardware=<target>/date=<day>/part-<run>-<n>.jsonl        request/response ids
    vllm-acceptance/hardware=<target>/date=<day>/part-<run>-<n>.jsonl   scrape windows

Rows are buffered by :meth:`PartSink.add` (cheap: the front calls it on its request path)
and written by :meth:`PartSink.flush`, which the deployment's poll loop calls through
:meth:`PartSink.flush_if_due` (every ``flush_rows`` rows or ``flush_s`` seconds) and at the
end. A part that cannot be written keeps its rows for the next flush, under a new number,
as the server's capture does; they are versioned with the store (``data.dvc``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.hardware import HardwareTarget
from serving.records import store

log = logging.getLogger(__name__)

PAIRS = "vllm-pairs"
ACCEPTANCE = "vllm-acceptance"


def area_parts(root: Path, area: str, hardware: HardwareTarget) -> list[Path]:
    """Every committed part of ``area`` for ``hardware``, oldest name first."""
    return store.part_files(Path(root), f"{area}/hardware={hardware.name}")


class PartSink:
    def __init__(
        self,
        root: Path,
        area: str,
        *,
        hardware: HardwareTarget,
        run_id: str,
        flush_rows: int = 64,
        flush_s: float = 30.0,
        transform: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        """``transform`` (e.g. redaction) runs on each row when it is added, off the
        front's request path only if ``add`` is; a row it turns into None is dropped."""
        store.partition_dir(Path(root), hardware.name, 0.0, area)  # a bad target fails here
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
        self.transform = transform
        self._pending: list[dict[str, Any]] = []  # added, not yet transformed

    def add(self, row: dict[str, Any]) -> None:
        """Buffer ``row`` (cheap: the transform waits for the flush)."""
        with self._lock:
            self._pending.append(row)

    def _transform_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        kept = [
            out
            for row in pending
            if (out := self.transform(row) if self.transform else row) is not None
        ]
        with self._lock:
            self._rows.extend(kept)

    def flush_if_due(self) -> int:
        self._transform_pending()
        with self._lock:
            due = len(self._rows) >= self.flush_rows or (
                self._rows and time.monotonic() - self._last_flush >= self.flush_s
            )
        return self.flush() if due else 0

    def flush(self) -> int:
        """Write the buffered rows as new parts; return how many rows were written."""
        self._transform_pending()
        with self._lock:
            rows, self._rows = self._rows, []
            self._last_flush = time.monotonic()
            planned = store.plan_parts(
                self.root, self.hardware.name, self.run_id, self._number, rows, self.area
            )
            self._number += len(planned)  # past every planned number, written or not
            written = 0
            for path, part_rows in planned:
                try:
                    store.write_part(path, part_rows)
                except OSError:
                    log.exception("could not write %s; its rows wait for the next flush", path)
                    self._rows[:0] = part_rows
                    continue
                written += len(part_rows)
            self.written += written
            return written

    def close(self) -> None:
        self.flush()
