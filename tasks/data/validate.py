"""Validate collected request records before anything trains on them.

Three stages; every input row ends in exactly one of ``valid`` or ``quarantined`` (with its
reasons), never dropped silently:

1. ``parse``: the row must be a JSON object that :class:`serving.records.schema.RequestRecord`
   accepts (structure, types, no extra fields, no NaN/inf). Reasons name the field.
2. ``duplicate``: among parsed rows the first occurrence of an id is kept; later ones are
   quarantined, naming where the first one came from. Ids parsed in an earlier run
   (``known_ids``, :mod:`tasks.data.incremental`) count as seen first.
3. ``expectations``: three Great Expectations suites over the parsed records
   (:mod:`tasks.data.expectations`: requests, disagreements, drafted tokens). A request
   with any failing row in any suite is quarantined once, with every reason.

Rows of an older schema version are read as the current one
(:func:`serving.records.schema.parse_record`; a version-1 record has no drafted tokens),
and the valid records come out in the current version; a quarantined row keeps its raw
form. The summary counts the stored versions of the rows that parsed (``versions_read``).

Great Expectations is skipped when no row survives stages 1-2. :func:`validate_store` runs
this over a store's records and writes the quarantine and a JSON summary atomically, so a
re-run with the same run id gives the same files.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from serving.atomic import write_json_atomic, write_jsonl_atomic
from serving.errors import BadInputError
from serving.records.schema import (
    RECORD_WORKLOADS,
    SCHEMA_VERSION,
    RequestRecord,
    UnknownSchemaVersionError,
    parse_record,
)
from serving.records.store import QUARANTINE, read_raw
from tasks.data.expectations import (
    SUITES,
    expectation_reasons,
    reports_from_reasons,
    skipped_suite,
)
from tasks.data.validation_summary import StoreValidation, SuiteReport, ValidationSummary

log = logging.getLogger(__name__)

STAGES = ("parse", "duplicate", "expectations")


@dataclass(frozen=True)
class ValidationResult:
    valid: list[RequestRecord]  # parsed records (the current version), in input order
    quarantined: list[dict]  # {"source", "record" (the raw row), "stage", "reasons"}
    summary: ValidationSummary  # counts; see ``_summarise``
    valid_sources: list[str] = field(default_factory=list)  # where each valid record was


@dataclass(frozen=True)
class StoreValidationResult(ValidationResult):
    summary: StoreValidation


# --- Stages 1 and 2 --------------------------------------------------------------------------


def _format_error(error: ErrorDetails) -> str:
    loc = ".".join(str(part) for part in error["loc"]) or "record"
    return f"{loc}: {error['msg']}"


def _parse(row: object) -> tuple[RequestRecord | None, int, list[str]]:
    """The record (``None`` when the row does not parse), the schema version it was stored
    in (0 when it does not parse), and the reasons it does not parse."""
    if isinstance(row, str):
        return None, 0, ["not JSON"]
    if not isinstance(row, dict):
        return None, 0, [f"not a JSON object (got {type(row).__name__})"]
    try:
        return parse_record(row), row["schema_version"], []
    except ValidationError as error:
        return None, 0, [_format_error(e) for e in error.errors()]
    except UnknownSchemaVersionError as error:
        return None, 0, [str(error)]


# --- Summary and entry points ----------------------------------------------------------------


def _reason_key(reason: str) -> str:
    """A reason without row-specific detail, for counting: list indices become ``*``, a
    duplicate's id and source are dropped, a disagreement's or drafted token's index is
    dropped."""
    if reason.startswith("duplicate id "):
        return "duplicate id"
    for noun in ("disagreement", "drafted"):
        if reason.startswith(f"{noun} "):
            return f"{noun}: " + reason.split(": ", 1)[1]
    field, sep, message = reason.partition(": ")
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", field) + sep + message


def _summarise(
    total: int,
    valid: int,
    quarantined: list[dict],
    suites: dict[str, SuiteReport],
    versions_read: Counter[int],
) -> ValidationSummary:
    by_stage = Counter(entry["stage"] for entry in quarantined)
    by_reason = Counter(
        key for entry in quarantined for key in dict.fromkeys(map(_reason_key, entry["reasons"]))
    )
    return ValidationSummary(
        schema_version=SCHEMA_VERSION,  # of the valid records as returned
        versions_read={str(v): versions_read[v] for v in sorted(versions_read)},
        total=total,
        valid=valid,
        quarantined=len(quarantined),
        by_stage={stage: by_stage.get(stage, 0) for stage in STAGES},
        by_reason=dict(sorted(by_reason.items())),
        suites=suites,
    )


def _combine_suites(reports: Sequence[SuiteReport]) -> SuiteReport:
    ran = [report for report in reports if report.ran]
    if not ran:
        return skipped_suite()
    unexpected: Counter[str] = Counter()
    for report in ran:
        unexpected.update(report.unexpected)
    return SuiteReport(
        ran=True,
        success=all(report.success for report in ran),
        rows=sum(report.rows for report in ran),
        unexpected=dict(unexpected),
    )


def combine_summaries(summaries: Sequence[ValidationSummary]) -> ValidationSummary:
    """One summary for rows validated in several runs (each a :func:`validate_records`
    summary of disjoint rows): counts add up; a suite ran if it ran in any run and
    succeeded if it succeeded in every run where it ran."""
    added: dict[str, Counter] = {key: Counter() for key in ("versions", "stage", "reason")}
    for summary in summaries:
        added["versions"].update({int(v): n for v, n in summary.versions_read.items()})
        added["stage"].update(summary.by_stage)
        added["reason"].update(summary.by_reason)
    versions = added["versions"]
    return ValidationSummary(
        schema_version=SCHEMA_VERSION,
        versions_read={str(v): versions[v] for v in sorted(versions)},
        total=sum(s.total for s in summaries),
        valid=sum(s.valid for s in summaries),
        quarantined=sum(s.quarantined for s in summaries),
        by_stage={stage: added["stage"].get(stage, 0) for stage in STAGES},
        by_reason=dict(sorted(added["reason"].items())),
        suites={name: _combine_suites([s.suites[name] for s in summaries]) for name in SUITES},
    )


def summary_of_subset(
    earlier: ValidationSummary,
    valid: Sequence[Mapping],
    quarantined: Sequence[dict],
    versions_read: Counter[int],
) -> ValidationSummary:
    """The summary :func:`validate_records` gives for some of the rows one run of it
    validated, without validating them again: ``valid`` (records, as stored) and ``quarantined``
    (entries) are that run's verdicts on the rows kept, ``versions_read`` the stored schema
    versions of those of them that parsed, ``earlier`` that run's summary. The suites'
    reports follow from the run's reasons (:func:`reports_from_reasons`). How
    :mod:`tasks.data.retention` updates a batch some of whose parts it removed."""
    checked = [entry for entry in quarantined if entry["stage"] == "expectations"]
    suites = reports_from_reasons(
        [*valid, *(entry["record"] for entry in checked)],
        [*([] for _ in valid), *(entry["reasons"] for entry in checked)],
        earlier.suites,
    )
    total = len(valid) + len(quarantined)
    return _summarise(total, len(valid), list(quarantined), suites, versions_read)


def check_known(
    known_hardware: Collection[str], known_workloads: Collection[str]
) -> tuple[list[str], list[str]]:
    """The known hardware targets and workloads as lists; :class:`BadInputError` naming
    them when one is a bare string or empty."""
    if isinstance(known_hardware, str) or isinstance(known_workloads, str):
        raise BadInputError(
            f"known_hardware ({known_hardware!r}) and known_workloads ({known_workloads!r}) "
            "must be collections of names, not one string: wrap it in a list"
        )
    known_hardware, known_workloads = list(known_hardware), list(known_workloads)
    if not known_hardware or not known_workloads:
        raise BadInputError(
            f"known_hardware ({known_hardware!r}) and known_workloads ({known_workloads!r}) "
            "must be non-empty: every record would be quarantined; pass the configured "
            "targets (serving.hardware.load_hardware().targets) and workloads"
        )
    return known_hardware, known_workloads


def validate_records(
    rows: Iterable[tuple[str, object]],
    *,
    known_hardware: Collection[str],
    known_workloads: Collection[str] = RECORD_WORKLOADS,
    now: float | None = None,
    known_ids: Mapping[str, str] | None = None,
) -> ValidationResult:
    """Validate ``(source, row)`` pairs (as :func:`serving.records.store.read_raw` yields them).

    ``now`` (unix seconds, default the current time) bounds timestamps: at most a day later.
    ``known_ids`` maps ids that an earlier run already parsed to where they were: a row
    with one of them is a duplicate. Returns the valid records and the quarantined rows,
    each with its stage and reasons.
    """
    known_hardware, known_workloads = check_known(known_hardware, known_workloads)
    now = time.time() if now is None else now
    if not math.isfinite(now):
        raise BadInputError(f"now must be a finite unix time, got {now!r}")

    total = 0
    # Per input position: a parsed record, or its quarantine entry.
    parsed: list[tuple[int, str, object, RequestRecord]] = []
    quarantine: dict[int, dict] = {}
    first_seen: dict[str, str] = dict(known_ids or {})
    versions_read: Counter[int] = Counter()
    for position, (source, row) in enumerate(rows):
        total += 1
        record, version, reasons = _parse(row)
        if record is None:
            quarantine[position] = _entry(source, row, "parse", reasons)
            continue
        versions_read[version] += 1
        if record.id in first_seen:
            reason = f"duplicate id {record.id} (first at {first_seen[record.id]})"
            quarantine[position] = _entry(source, row, "duplicate", [reason])
        else:
            first_seen[record.id] = source
            parsed.append((position, source, row, record))

    if parsed:
        reasons_by_row, suites = expectation_reasons(
            [record for *_, record in parsed],
            known_hardware=known_hardware,
            known_workloads=known_workloads,
            now=now,
        )
    else:
        reasons_by_row = {}
        suites = {name: skipped_suite() for name in SUITES}

    valid: list[RequestRecord] = []
    valid_sources: list[str] = []
    for index, (position, source, row, record) in enumerate(parsed):
        if index in reasons_by_row:
            quarantine[position] = _entry(source, row, "expectations", reasons_by_row[index])
        else:
            valid.append(record)
            valid_sources.append(source)
    quarantined = [quarantine[position] for position in sorted(quarantine)]

    if len(valid) + len(quarantined) != total:  # nothing is ever dropped silently
        raise RuntimeError(
            f"validation lost rows: {total} in, {len(valid)} valid + {len(quarantined)} quarantined"
        )
    summary = _summarise(total, len(valid), quarantined, suites, versions_read)
    log.info(
        "validated %d rows: %d valid, %d quarantined %s",
        total,
        len(valid),
        len(quarantined),
        summary.by_stage,
    )
    return ValidationResult(
        valid=valid, quarantined=quarantined, summary=summary, valid_sources=valid_sources
    )


def _entry(source: str, row: object, stage: str, reasons: list[str]) -> dict:
    return {"source": source, "record": row, "stage": stage, "reasons": reasons}


def quarantine_path(root: Path, run_id: str) -> Path:
    return Path(root) / QUARANTINE / f"part-{run_id}.jsonl"


def validate_store(
    root: Path,
    *,
    known_hardware: Collection[str],
    run_id: str,
    report_dir: Path | None = None,
    known_workloads: Collection[str] = RECORD_WORKLOADS,
    now: float | None = None,
) -> StoreValidationResult:
    """Validate every committed record part under ``root`` and write, atomically,
    ``root/quarantine/part-<run_id>.jsonl`` (removed when nothing is quarantined) and
    ``report_dir/validation-<run_id>.json`` (the summary; default ``root/reports``).

    Re-running with the same ``run_id`` overwrites both files with the same content.
    """
    if not run_id or run_id.startswith(".") or any(c in run_id for c in "/\\\0"):
        raise BadInputError(
            f"run_id {run_id!r} cannot name a file: use letters, digits, '-' or '_'"
        )
    root = Path(root)
    report_dir = root / "reports" if report_dir is None else Path(report_dir)
    result = validate_records(
        read_raw(root),
        known_hardware=known_hardware,
        known_workloads=known_workloads,
        now=now,
    )
    path = quarantine_path(root, run_id)
    if result.quarantined:
        write_jsonl_atomic(path, result.quarantined)
        log.warning("quarantined %d rows into %s", len(result.quarantined), path)
    else:
        path.unlink(missing_ok=True)
    summary = StoreValidation(
        **dict(result.summary),
        run_id=run_id,
        quarantine_file=str(path.relative_to(root)) if result.quarantined else None,
    )
    write_json_atomic(report_dir / f"validation-{run_id}.json", summary.model_dump(mode="json"))
    return StoreValidationResult(
        valid=result.valid,
        quarantined=result.quarantined,
        summary=summary,
        valid_sources=result.valid_sources,
    )
