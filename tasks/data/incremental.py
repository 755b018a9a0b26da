"""Incremental validation: each run validates only the store parts no earlier run did.

The store only grows (parts are written once, :mod:`serving.records.store`), so validating
all of it every run costs more and more for nothing. :func:`validate_incrementally` keeps
the verdicts of earlier runs as batches in the dataset folder (:mod:`tasks.data.ledger`),
validates the new parts with the ids of every earlier record counted as already seen (a
record accepted in an earlier run and stored again is a duplicate, as in one run over the
whole store), commits the new batch, and returns every valid and quarantined row, earlier
and new, in store order, with the summaries of all batches combined.

So the result equals that of one run over the whole store, except for which copy of a
duplicated id is kept when a new part sorts before the earlier copy's part: the earlier
run's (already trained on) stays, the new one is quarantined.

A run is re-validated in full (every part, new batch numbering; the old batches are
removed once the new ledger is committed) when asked (``full=True``), when there is no
ledger yet, or when the rules changed (the known hardware or workloads, the schema, the
validation code). A part that changed since it was validated is an error
(:class:`tasks.data.ledger.ChangedPartError`), not skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from serving.atomic import write_jsonl_atomic
from serving.errors import BadInputError
from serving.records import schema, store
from serving.records.schema import RECORD_WORKLOADS, SCHEMA_VERSION, RequestRecord, parse_record
from tasks.data import expectations, ledger, validate
from tasks.data.ledger import Ledger
from tasks.data.validation_summary import IncrementalSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IncrementalResult:
    valid: list[RequestRecord]  # every valid record (earlier runs' and this one's), store order
    quarantined: list[dict]  # every quarantined row with its stage and reasons, in store order
    summary: IncrementalSummary  # totals over all batches, plus this run's


def validation_rules(known_hardware: Collection[str], known_workloads: Collection[str]) -> dict:
    """What the verdicts depend on besides the rows: when it changes, earlier verdicts
    are stale. The code is the three modules that decide validity (a change to any of them
    re-validates everything once, which costs one full run)."""
    code = hashlib.sha256()
    for module in (schema, validate, expectations):
        code.update(Path(str(module.__file__)).read_bytes())
    return {
        "schema_version": SCHEMA_VERSION,
        "known_hardware": sorted(set(known_hardware)),
        "known_workloads": sorted(set(known_workloads)),
        "code": code.hexdigest()[:16],
    }


def _full_reason(committed: Ledger | None, rules: dict, full: bool) -> str | None:
    if full:
        return "asked for (full=True)"
    if committed is None:
        return "no ledger yet"
    changed = [
        key
        for key in sorted({*rules, *committed.rules})
        if rules.get(key) != committed.rules.get(key)
    ]
    return f"the validation rules changed ({', '.join(changed)})" if changed else None


def _read_batches(folder: Path, base: Ledger) -> tuple[list[dict], list[dict]]:
    """The valid and the quarantine entries of ``base``'s batches."""
    valid: list[dict] = []
    quarantined: list[dict] = []
    for batch in base.batches:
        valid_file, quarantine_file = ledger.batch_files(folder, batch)
        valid += ledger.read_batch_file(valid_file)
        quarantined += ledger.read_batch_file(quarantine_file)
    return valid, quarantined


def _earlier_record(entry: dict, folder: Path) -> tuple[str, RequestRecord]:
    """A valid entry of an earlier batch, read back as the record it was validated as."""
    try:
        return entry["source"], parse_record(entry["record"])
    except (KeyError, TypeError, ValidationError, BadInputError) as error:
        raise BadInputError(
            f"a valid entry in {folder} no longer reads as a record ({error}): re-validate "
            "everything (`specops data validate --full`, or delete the ledger)"
        ) from None


def _parsed_ids(valid: list[dict], quarantined: list[dict]) -> dict[str, str]:
    """Id -> source of every row an earlier run parsed and did not find a duplicate (the
    valid ones and those its expectations rejected): what one run over the whole store
    would have seen first."""
    ids = {entry["record"]["id"]: entry["source"] for entry in valid}
    ids.update(
        (entry["record"]["id"], entry["source"])
        for entry in quarantined
        if entry["stage"] == "expectations"
    )
    return ids


def _committed(folder: Path, full: bool) -> Ledger | None:
    try:
        return ledger.load_ledger(folder)
    except BadInputError:
        if not full:
            raise
        log.warning("ignoring the unreadable ledger in %s: re-validating everything", folder)
        return None


def validate_incrementally(
    store_root: Path,
    out_dir: Path,
    *,
    known_hardware: Collection[str],
    known_workloads: Collection[str] = RECORD_WORKLOADS,
    full: bool = False,
    now: float | None = None,
) -> IncrementalResult:
    """Validate the parts of ``store_root`` that the ledger in ``out_dir/validated`` does
    not hold, commit them as a new batch and return every row's verdict (see the module
    docstring). Run it under :func:`tasks.data.ledger.exclusive` of that folder, as
    :func:`tasks.data.curate.curate` does.

    The summary is :func:`tasks.data.validate.combine_summaries` over all batches (so
    ``total``, ``valid``, ``quarantined``, ``by_stage``, ``by_reason``, ``suites`` are
    totals) plus ``mode`` (``incremental`` or ``full``), ``full_reason``, ``parts`` (all
    validated parts), ``new_parts``, ``new_rows`` and ``new`` (this run's own summary):
    :class:`~tasks.data.validation_summary.IncrementalSummary`.
    """
    root, folder = Path(store_root), ledger.folder_of(out_dir)
    known_hardware, known_workloads = validate.check_known(known_hardware, known_workloads)
    rules = validation_rules(known_hardware, known_workloads)
    committed = _committed(folder, full)
    ledger.remove_uncommitted(folder, committed)  # what a killed run left
    reason = _full_reason(committed, rules, full)
    if reason is None and committed is not None:
        base = ledger.check_parts(root, committed)
    else:
        base = Ledger(rules=rules)
    earlier_valid, earlier_quarantined = _read_batches(folder, base)

    new_paths = ledger.unvalidated_parts(root, base)
    stamps = [(store.part_key(root, path), ledger.stamp(path)) for path in new_paths]
    result = validate.validate_records(
        store.read_parts(root, new_paths),
        known_hardware=known_hardware,
        known_workloads=known_workloads,
        now=now,
        known_ids=_parsed_ids(earlier_valid, earlier_quarantined),
    )
    new_records = list(zip(result.valid_sources, result.valid, strict=True))
    new_valid = [
        {"source": source, "record": record.model_dump(mode="json")}
        for source, record in new_records
    ]
    updated = base
    if new_paths:
        number = max(base.next_number(), committed.next_number() if committed else 0)
        updated = ledger.with_batch(base, stamps, result.summary, number=number)
        valid_file, quarantine_file = ledger.batch_files(folder, updated.batches[-1])
        write_jsonl_atomic(valid_file, new_valid)
        write_jsonl_atomic(quarantine_file, result.quarantined)
    if committed is None or updated.to_dict() != committed.to_dict():
        ledger.save_ledger(folder, updated)  # the commit: batch files first, ledger last
        ledger.remove_uncommitted(folder, updated)  # a full run's superseded batches
    log.info(
        "validated %d new parts (%d rows, %s); %d parts in all",
        len(new_paths),
        result.summary.total,
        "full" if reason else "incremental",
        len(updated.parts()),
    )

    summary = IncrementalSummary(
        **dict(validate.combine_summaries([batch.summary for batch in updated.batches])),
        mode="full" if reason else "incremental",
        full_reason=reason,
        parts=len(updated.parts()),
        new_parts=len(new_paths),
        new_rows=result.summary.total,
        new=result.summary,
    )
    records = [_earlier_record(entry, folder) for entry in earlier_valid] + new_records
    return IncrementalResult(
        valid=[record for _, record in sorted(records, key=lambda r: ledger.source_order(r[0]))],
        quarantined=_in_store_order(earlier_quarantined + result.quarantined),
        summary=summary,
    )


def _in_store_order(entries: list[dict]) -> list[dict]:
    """Entries by their source's part and line: the order one run over the store reads."""
    return sorted(entries, key=lambda entry: ledger.source_order(entry["source"]))
