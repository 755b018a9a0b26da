"""The store as the loop's steps read it: every record that parses, read in full
(:func:`read_valid_records`), or, within one ``collect``, the view its validation leaves
(:class:`StoreView`), which reads no record part again.

``collect`` validates only the parts new since its last run (:mod:`tasks.data.incremental`):
the valid records of the earlier parts come back from the ledger's batches in the dataset
folder, those of the new parts as this run validated them, all in memory. The view keeps
the ones of the hardware target ``collect`` serves, for the steps after validation that
judge its champion: the watch (:mod:`tasks.loop.watch`), the shadow scores
(:mod:`tasks.loop.shadow`) and the retrain trigger (:mod:`tasks.loop.triggers`). On a vLLM
target it also holds the windows its deployment scraped from vLLM's counters
(``vllm-acceptance/`` parts, which validation does not read), read once when the view is
built, for the watch and the trigger.

The view holds *validated* records: those that passed every stage of validation, the
Great Expectations suites included (:mod:`tasks.data.validate`). A quarantined row (more
accepted tokens than drafted, steps that do not add up to the totals, a timestamp a day
ahead, a second copy of an id) drives no rollback and no retrain, as it trains nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from serving.hardware import HardwareTarget
from serving.records.schema import RequestRecord, UnknownSchemaVersionError, parse_record
from serving.records.store import read_raw
from tasks.data.vllm_acceptance import (
    ScrapedAcceptance,
    ScrapedWindow,
    pooled_windows,
    read_windows,
)

log = logging.getLogger(__name__)


def read_valid_records(
    root: str | Path, *, hardware_name: str | None = None
) -> list[RequestRecord]:
    """The records under ``root`` that parse (:func:`serving.records.schema.parse_record`,
    older versions read as the current one; first copy of each id), optionally only those
    whose stored ``hardware`` is ``hardware_name`` (any name records carry, a target of
    ``configs/hardware.yaml`` or not): every part, read in full. Malformed rows are skipped
    here (and counted in the log); :mod:`tasks.data.validate` is where they are quarantined
    with their reasons, and where the records a ``collect`` judges come from
    (:class:`StoreView`)."""
    records: list[RequestRecord] = []
    seen: set[str] = set()
    skipped = 0
    for _, row in read_raw(Path(root)):
        try:
            record = parse_record(row)
        except (ValidationError, UnknownSchemaVersionError):
            skipped += 1
            continue
        if record.id in seen or (hardware_name is not None and record.hardware != hardware_name):
            continue
        seen.add(record.id)
        records.append(record)
    if skipped:
        log.warning("skipped %d malformed record rows under %s", skipped, root)
    return records


class StoreView:
    """What one ``collect`` knows of the store at ``root`` for the hardware target
    ``hardware`` once it validated it (see the module docstring): ``records``, the validated
    records of that target in store order, and ``windows``, on a vLLM target the windows
    scraped from vLLM's counters, oldest first (none elsewhere).

    A plain class rather than a pydantic model or a dataclass, on purpose: Prefect walks
    those element by element when they are a task's parameter (looking for futures in
    them), which over every token id of every record costs seconds per thousand records,
    once per task; this one it hands over as it is."""

    __slots__ = ("hardware", "records", "root", "windows")

    def __init__(
        self,
        root: Path,
        hardware: HardwareTarget,
        records: Iterable[RequestRecord] = (),
        windows: Iterable[ScrapedWindow] = (),
    ) -> None:
        self.root = Path(root)
        self.hardware = hardware
        self.records: tuple[RequestRecord, ...] = tuple(records)
        self.windows: tuple[ScrapedWindow, ...] = tuple(windows)

    @classmethod
    def of(cls, root: Path, hardware: HardwareTarget, valid: Iterable[RequestRecord]) -> StoreView:
        """The view of ``valid`` (validation's records of the whole store at ``root``) for
        ``hardware``; on a vLLM target with the windows scraped there, read now."""
        name = hardware.name
        windows = read_windows(Path(root), hardware) if hardware.backend == "vllm" else []
        return cls(root, hardware, (r for r in valid if r.hardware == name), windows)

    def served_by(self, champion: str | None) -> list[RequestRecord]:
        """The records ``champion`` (a registry label) served; every record for None."""
        return [r for r in self.records if champion is None or r.drafter_version == champion]

    def scraped(self, champion: str | None, *, window: int) -> list[ScrapedAcceptance]:
        """The ``live`` group of the newest windows ``champion`` served covering ``window``
        requests (:func:`tasks.data.vllm_acceptance.pooled_windows`); [] without any."""
        return pooled_windows(self.windows, self.hardware, champion=champion, window=window)

    def __repr__(self) -> str:
        return (
            f"StoreView({str(self.root)!r}, {self.hardware.name!r}: {len(self.records)} "
            f"records, {len(self.windows)} windows)"
        )
