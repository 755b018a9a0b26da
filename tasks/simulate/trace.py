"""Arrivals replayed from captured traffic (``specops simulate trace``).

Every stored record carries its request's timestamp and its prompt and output token ids:
sorted by time and rebased to 0 they are a ``kind: trace`` arrivals section with
``lengths: per_request``, so a scenario replays the traffic a server actually saw, request
by request. Engine records (``DetailedRecord``) carry no timestamp and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypedDict

from pydantic import ValidationError

from serving.errors import BadInputError
from serving.records.schema import UnknownSchemaVersionError, parse_record
from tasks.simulate.acceptance import record_rows


class TraceSection(TypedDict):
    """A scenario's ``arrivals`` section replaying traffic
    (:class:`tasks.simulate.config.TraceArrivals` validates it)."""

    kind: Literal["trace"]
    lengths: Literal["per_request"]
    timestamps: list[float]  # seconds from the first request
    prompt_tokens: list[int]
    output_tokens: list[int]


def trace_from_records(
    paths: Sequence[str | Path],
    *,
    workload: str | None = None,
    hardware_name: str | None = None,
) -> TraceSection:
    """The ``arrivals`` section replaying the records under ``paths`` (only ``workload``'s
    and those stored under ``hardware_name`` when given: any name records carry)."""
    if not paths:
        raise BadInputError("no records given: pass a capture store, a folder or a file")
    requests: list[tuple[float, int, int]] = []
    for path in paths:
        for where, row in record_rows(Path(path)):
            if isinstance(row, dict) and isinstance(row.get("drafter"), dict):
                raise BadInputError(
                    f"records: {where} is an engine record without a timestamp; give a "
                    "capture store (what the server's capture or `specops data collect` write)"
                )
            try:
                record = parse_record(row)
            except (ValidationError, UnknownSchemaVersionError, TypeError) as error:
                raise BadInputError(f"records: {where} is not a readable record: {error}") from None
            if workload is not None and record.workload != workload:
                continue
            if hardware_name is not None and record.hardware != hardware_name:
                continue
            requests.append(
                (record.timestamp, len(record.prompt_token_ids), len(record.output_token_ids))
            )
    if not requests:
        chosen = ", ".join(
            f"{k} {v!r}" for k, v in (("workload", workload), ("hardware", hardware_name)) if v
        )
        raise BadInputError(
            f"no records{' of ' + chosen if chosen else ''} under {', '.join(map(str, paths))}"
        )
    requests.sort()
    start = requests[0][0]
    return {
        "kind": "trace",
        "lengths": "per_request",
        "timestamps": [round(t - start, 6) for t, _, _ in requests],
        # The engine prefills all but the prompt's last token; every request has an output.
        "prompt_tokens": [max(p - 1, 0) for _, p, _ in requests],
        "output_tokens": [max(o, 1) for _, _, o in requests],
    }
