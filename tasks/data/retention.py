"""Retention: users' traffic leaves the live store, with every copy validation kept of it,
once it is older than a configured age (``configs/store.yaml``, ``retention.days``).

What holds users' traffic in the store (:mod:`serving.records.store`), and goes:

- ``records/``: the request records (prompts, outputs, token ids);
- ``vllm-pairs/``: the prompt and answer token ids captured in front of vLLM;
- ``vllm-acceptance/``: the windows scraped from vLLM's counters (no text, but the same age
  rule, so that the store has one);
- ``quarantine/``: whole-store quarantines of :func:`tasks.data.validate.validate_store`
  (nothing in the loop writes them now; older stores may have some).

And in each dataset folder that validates the store (:mod:`tasks.data.ledger`): the
validated batches' copies of the records (``batch-<n>-valid.jsonl``) and of the rejected
rows (``batch-<n>-quarantine.jsonl``: the same rule applies to the quarantine), and the
dataset files built from them (``quarantine.jsonl`` and :data:`tasks.data.dataset.PARTS`).

**The rule.** Parts are write-once and written at once (their rows span seconds), so the
unit is the part: a part goes when its *newest* row is older than ``now - days``; a record
lives at most until the newest row of its part ages out. A row's age is its ``timestamp``
(a quarantine entry's, its record's); a row without a usable one (not JSON, no timestamp,
or one more than a day ahead) counts as written at the part's mtime, so nothing crashes on
it and nothing unreadable stays forever. Rows are partitioned by the day of their
timestamp, so a partition of a day after the cutoff's day is not even read.

**The order**, with the lock of every dataset folder named held throughout (the one
validation takes, :func:`tasks.data.ledger.exclusive`), so that none validates meanwhile:

1. read the candidate parts; the expired ones are known;
2. per dataset folder, every batch holding an expired part is rewritten under a new number
   without the rows whose ``source`` is in one (a row that could not be parsed has a
   source too, so it goes with its part), its summary recomputed from the verdicts kept
   (:func:`tasks.data.validate.summary_of_subset`: no row is validated again); a batch
   left with no part is dropped. The dataset files lose the removed rows (atomically);
   then the new ledger is committed (atomically: the one commit), and the superseded
   batch files are removed;
3. the expired parts are deleted, then the ``date=`` (and ``hardware=``) folders they
   leave empty, and stale hidden temporaries of killed writers.

A run killed anywhere leaves a state the next run finishes: before the commit, batch files
no ledger names (removed by the next run, of retention or validation, as after a killed
validation) and the old ledger, consistent with the store; after it, expired parts no
ledger names, which the next run finds expired again and deletes. Nothing is lost (a kept
part's rows are never touched) and nothing is forgotten half-way. Should a validation run
before that retention run, it validates those leftover parts again, and retention removes
them again. Running it twice removes nothing the second time.

One divergence from validating the remaining store from scratch: a copy of a removed record
found in a kept part stays quarantined as a duplicate (``--full`` re-validation accepts
it). DVC keeps every version it pushed; docs/data.md ("Retention") says how to remove those.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serving.atomic import write_jsonl_atomic
from serving.errors import BadInputError
from serving.gateway.sink import ACCEPTANCE, PAIRS
from serving.paths import CONFIG_DIR
from serving.records import store
from tasks.data import ledger, validate
from tasks.data.dataset import PARTS
from tasks.data.expectations import MAX_CLOCK_SKEW_S
from tasks.data.ledger import Batch

STORE_CONFIG = CONFIG_DIR / "store.yaml"
DAY_S = 86_400.0
# The store's areas of users' traffic: partitioned by day, then the flat quarantine.
AREAS = (store.RECORDS, PAIRS, ACCEPTANCE, store.QUARANTINE)
_PARSED = ("duplicate", "expectations")  # quarantine stages of rows that parsed


# --- configuration ----------------------------------------------------------------------------


class RetentionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Days a record is kept; None keeps everything. Strict: "30" or true is refused.
    days: float | None = Field(default=30.0, gt=0, allow_inf_nan=False, strict=True)


class StoreConfig(BaseModel):
    """``configs/store.yaml``: the live store's policies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retention: RetentionSettings = RetentionSettings()


def _reasons(error: ValidationError, prefix: str = "") -> str:
    return "; ".join(
        f"{prefix}{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e['input']!r})"
        for e in error.errors()
    )


def load_store_config(path: str | Path = STORE_CONFIG) -> StoreConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return StoreConfig.model_validate(raw)
    except (OSError, yaml.YAMLError) as error:
        raise BadInputError(f"cannot read the store config {str(path)!r}: {error}") from None
    except ValidationError as error:
        raise BadInputError(
            f"invalid store config {str(path)!r}: {_reasons(error)}; retention.days is a "
            "positive number of days, or null to keep everything"
        ) from None


def check_days(days: object) -> float | None:
    """``days`` as retention's age limit, checked as the config checks it:
    :class:`BadInputError` naming it unless a positive finite number (or None: keep)."""
    try:
        return RetentionSettings.model_validate({"days": days}).days
    except ValidationError as error:
        raise BadInputError(
            f"retention days must be a positive number of days, got {days!r} "
            f"({error.errors()[0]['msg']}); to keep everything, set retention.days "
            f"to null in configs/{STORE_CONFIG.name}"
        ) from None


# --- the report -------------------------------------------------------------------------------


class DatasetReport(BaseModel):
    """What one dataset folder lost: its batches' copies, and rows of its dataset files."""

    model_config = ConfigDict(extra="forbid")  # filled in as retention goes

    folder: str
    batches_rewritten: int = 0
    batches_dropped: int = 0
    copies: int = 0  # valid and quarantine rows of the batches
    dataset_rows: int = 0  # rows of quarantine.jsonl and the dataset parts


class RetentionReport(BaseModel):
    """What retention removed (``specops data retention --json``, the collect flow's
    ``retention``)."""

    model_config = ConfigDict(extra="forbid")  # filled in as retention goes

    max_age_days: float | None  # None: retention off, nothing removed
    cutoff: float | None  # unix seconds: a part whose newest row is older goes
    cutoff_utc: str | None = None  # the cutoff, readable (set from it)
    dry_run: bool = False
    parts: dict[str, int] = Field(default_factory=dict)  # area -> parts removed
    rows: dict[str, int] = Field(default_factory=dict)  # area -> rows in them
    removed: list[str] = Field(default_factory=list)  # the parts, store-relative
    folders: int = 0  # empty partition folders removed
    temporaries: int = 0  # stale hidden temporaries removed
    datasets: list[DatasetReport] = Field(default_factory=list)

    @model_validator(mode="after")
    def _readable_cutoff(self) -> RetentionReport:
        self.cutoff_utc = None if self.cutoff is None else _utc(self.cutoff)
        return self


def _utc(moment: float) -> str:
    return datetime.fromtimestamp(moment, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- which parts have aged out ----------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    path: Path
    key: str  # store-relative, as ledgers name it
    area: str
    rows: int
    versions: dict[str, int]  # source -> stored schema version, of the rows that have one


def _partition_day(path: Path) -> date | None:
    name = path.parent.name
    if not name.startswith("date="):
        return None
    try:
        return date.fromisoformat(name.removeprefix("date="))
    except ValueError:
        return None


def _timestamp(row: object, latest: float) -> float | None:
    """The row's ``timestamp`` (a quarantine entry's: its record's), if it is one to
    trust: a finite number no later than ``latest``."""
    if not isinstance(row, dict):
        return None
    value = row.get("timestamp")
    if value is None and isinstance(row.get("record"), dict):
        value = row["record"].get("timestamp")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value <= latest else None


def _expired_parts(root: Path, cutoff: float, now: float) -> list[_Part]:
    """The parts of every area whose newest row is older than ``cutoff``, in store order."""
    cutoff_day = datetime.fromtimestamp(cutoff, tz=UTC).date()
    expired = []
    for area in AREAS:
        for path in store.part_files(root, area):
            day = _partition_day(path)
            if day is not None and day > cutoff_day:
                continue  # every row is from that day, after the cutoff: not read
            newest, rows, untimed = -math.inf, 0, False
            versions: dict[str, int] = {}
            for source, row in store.read_parts(root, [path]):
                rows += 1
                stamp = _timestamp(row, now + MAX_CLOCK_SKEW_S)
                untimed = untimed or stamp is None
                newest = max(newest, -math.inf if stamp is None else stamp)
                version = row.get("schema_version") if isinstance(row, dict) else None
                if isinstance(version, int) and not isinstance(version, bool):
                    versions[source] = version
            if untimed or rows == 0:
                newest = max(newest, path.stat().st_mtime)
            if newest < cutoff:
                key = store.part_key(root, path)
                expired.append(_Part(path, key, area, rows, versions))
    return expired


# --- what the dataset folders kept of them ----------------------------------------------------


def _part_of(source: str) -> str:
    return source.rpartition(":")[0]


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open() as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _without(
    batch: Batch,
    valid: list[dict],
    quarantined: list[dict],
    expired: Collection[str],
    versions: dict[str, int],
    number: int,
) -> tuple[Batch | None, list[dict], list[dict]]:
    """``batch`` without the rows of the ``expired`` parts (None when none of its parts is
    left), renumbered ``number``, and the valid and quarantine rows it keeps."""
    parts = {key: stamp for key, stamp in batch.parts.items() if key not in expired}
    kept_valid = [e for e in valid if _part_of(e["source"]) not in expired]
    kept_quarantined = [e for e in quarantined if _part_of(e["source"]) not in expired]
    if not parts:
        return None, [], []
    removed_parsed = [e["source"] for e in valid if _part_of(e["source"]) in expired] + [
        e["source"]
        for e in quarantined
        if e["stage"] in _PARSED and _part_of(e["source"]) in expired
    ]
    versions_read = Counter({int(v): n for v, n in batch.summary.versions_read.items()})
    versions_read -= Counter(versions[s] for s in removed_parsed if s in versions)
    records = [e["record"] for e in kept_valid]
    summary = validate.summary_of_subset(batch.summary, records, kept_quarantined, versions_read)
    return Batch(number=number, parts=parts, summary=summary), kept_valid, kept_quarantined


Keep = Callable[[dict], bool]


def _filter_file(path: Path, keep: Keep, *, dry_run: bool) -> int:
    """Rewrite the JSONL file ``path`` (atomically) with only the rows ``keep`` accepts
    (``dry_run``: leave it); return how many it drops."""
    if not path.is_file():
        return 0
    rows = list(_jsonl(path))
    kept = [row for row in rows if keep(row)]
    if len(kept) != len(rows) and not dry_run:
        write_jsonl_atomic(path, kept)
    return len(rows) - len(kept)


def _forget(
    root: Path, dataset_dir: Path, expired: dict[str, _Part], *, dry_run: bool
) -> DatasetReport:
    """Rewrite ``dataset_dir``'s ledger without the ``expired`` parts (see the module
    docstring, step 2); with ``dry_run``, only count."""
    report = DatasetReport(folder=str(dataset_dir))
    folder = ledger.folder_of(dataset_dir)
    committed = ledger.load_ledger(folder)
    if committed is None:
        return report
    if not dry_run:
        ledger.remove_uncommitted(folder, committed)  # what a killed run left
    if not any(key in expired for key in committed.parts()):
        return report
    versions = {s: v for part in expired.values() for s, v in part.versions.items()}
    number = committed.next_number()
    batches: list[Batch] = []
    removed_ids: set[str] = set()
    for batch in committed.batches:
        if not any(key in expired for key in batch.parts):
            batches.append(batch)
            continue
        valid_file, quarantine_file = ledger.batch_files(folder, batch)
        valid, quarantined = (
            ledger.read_batch_file(valid_file),
            ledger.read_batch_file(quarantine_file),
        )
        rewritten, kept_valid, kept_quarantined = _without(
            batch, valid, quarantined, expired, versions, number
        )
        removed_ids.update(e["record"]["id"] for e in valid if _part_of(e["source"]) in expired)
        report.copies += len(valid) + len(quarantined) - len(kept_valid) - len(kept_quarantined)
        if rewritten is None:
            report.batches_dropped += 1
            continue
        report.batches_rewritten += 1
        batches.append(rewritten)
        number += 1
        if not dry_run:
            valid_file, quarantine_file = ledger.batch_files(folder, rewritten)
            write_jsonl_atomic(valid_file, kept_valid)
            write_jsonl_atomic(quarantine_file, kept_quarantined)
    # The dataset files before the commit: after it, nothing would say which records of
    # theirs came from the expired parts.
    report.dataset_rows = _filter_derived(dataset_dir, expired, removed_ids, dry_run=dry_run)
    if dry_run:
        return report
    updated = replace(committed, batches=tuple(batches))
    ledger.save_ledger(folder, updated)  # the commit
    ledger.remove_uncommitted(folder, updated)  # the superseded batch files
    return report


def _filter_derived(
    dataset_dir: Path, expired: Collection[str], removed_ids: Collection[str], *, dry_run: bool
) -> int:
    """Drop from the dataset files (rebuilt whole by the next validation) the quarantine
    rows of the ``expired`` parts and the records whose ids are ``removed_ids``."""

    def keep_quarantined(row: dict) -> bool:
        return _part_of(str(row.get("source", ""))) not in expired

    def keep_record(row: dict) -> bool:
        return row.get("id") not in removed_ids

    files = [("quarantine", keep_quarantined), *((name, keep_record) for name in PARTS)]
    return sum(
        _filter_file(Path(dataset_dir) / f"{name}.jsonl", keep, dry_run=dry_run)
        for name, keep in files
    )


# --- removal ----------------------------------------------------------------------------------


def _delete(path: Path) -> None:
    path.unlink(missing_ok=True)  # gone already: a killed run's, or another retention's


def _remove_empty_folders(root: Path, removed: Iterable[Path]) -> int:
    """Remove the partition folders that ``removed`` parts leave empty, up to (not
    including) the area; a folder a writer has just written into is left alone."""
    count = 0
    for folder in sorted({p.parent for p in removed}, reverse=True):
        while folder != root and folder.parent != root:  # never an area, nor the store
            try:
                folder.rmdir()
            except OSError:  # not empty (or gone)
                break
            count += 1
            folder = folder.parent
    return count


def apply_retention(
    store_root: Path,
    dataset_dirs: Sequence[Path] = (),
    *,
    max_age_days: float | None,
    now: float | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Remove the store's parts whose newest row is older than ``max_age_days`` before
    ``now`` (unix seconds, default the current time), and every copy that the dataset
    folders ``dataset_dirs`` (each validated from this store, :mod:`tasks.data.ledger`)
    kept of their rows; ``max_age_days`` None removes nothing. ``dry_run`` changes nothing
    and reports what would go. See the module docstring for the rule and the order.

    Name every dataset folder validated from the store: a folder left out keeps its copies
    and stops its next validation (the parts its ledger names are gone).
    """
    max_age_days = check_days(max_age_days)
    now = time.time() if now is None else float(now)
    if not math.isfinite(now):
        raise BadInputError(f"now must be a finite unix time, got {now!r}")
    if max_age_days is None:
        return RetentionReport(max_age_days=None, cutoff=None, dry_run=dry_run)
    root = Path(store_root)
    cutoff = now - max_age_days * DAY_S
    report = RetentionReport(max_age_days=max_age_days, cutoff=cutoff, dry_run=dry_run)
    # In a fixed order, so that two runs naming the same folders cannot deadlock.
    folders = sorted({os.path.abspath(d): Path(d) for d in dataset_dirs}.items())
    with ExitStack() as locks:
        if not dry_run:
            for _, folder in folders:
                locks.enter_context(ledger.exclusive(ledger.folder_of(folder)))
        expired = {part.key: part for part in _expired_parts(root, cutoff, now)}
        for part in expired.values():
            report.parts[part.area] = report.parts.get(part.area, 0) + 1
            report.rows[part.area] = report.rows.get(part.area, 0) + part.rows
        report.removed = list(expired)
        for _, folder in folders:
            report.datasets.append(_forget(root, folder, expired, dry_run=dry_run))
        if dry_run:
            return report
        for part in expired.values():
            _delete(part.path)
        report.folders = _remove_empty_folders(root, (p.path for p in expired.values()))
        report.temporaries = store.remove_stale_temporaries(root)
    return report
