"""What validation reports: counts per stage and reason, and each expectation suite's.

One model per shape, written as JSON where it goes (the ledger's batches, ``validation-*.json``
of :func:`tasks.data.validate.validate_store`, the dataset's ``summary.json``, the loop's
flow results): ``model_dump(mode="json")`` gives the keys in the order declared here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Summary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SuiteReport(_Summary):
    """One Great Expectations suite over the rows of one run (:mod:`tasks.data.expectations`)."""

    ran: bool
    success: bool | None  # None when it did not run
    rows: int  # requests, disagreements or drafted tokens checked
    unexpected: dict[str, int]  # expectation -> failing rows


class ValidationSummary(_Summary):
    """The counts of one validation (:func:`tasks.data.validate.validate_records`), or of
    several added up (:func:`tasks.data.validate.combine_summaries`)."""

    schema_version: int  # of the valid records as returned
    versions_read: dict[str, int]  # stored schema version -> rows of it that parsed
    total: int
    valid: int
    quarantined: int
    by_stage: dict[str, int]
    by_reason: dict[str, int]
    suites: dict[str, SuiteReport]


class StoreValidation(ValidationSummary):
    """:func:`tasks.data.validate.validate_store`'s: where this run's quarantine went."""

    run_id: str
    quarantine_file: str | None  # store-relative; None when nothing was quarantined


class IncrementalSummary(ValidationSummary):
    """:func:`tasks.data.incremental.validate_incrementally`'s: totals over every batch,
    and this run's own."""

    mode: Literal["incremental", "full"]
    full_reason: str | None  # why everything was re-validated
    parts: int  # every validated part
    new_parts: int
    new_rows: int
    new: ValidationSummary  # this run's
