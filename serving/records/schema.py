"""The collected-record schema (version 3): one request record per line, details nested.

A request record is what one request through the engine in detailed mode leaves behind: the
prompt and the target's output, per-request acceptance, every draft/target disagreement,
every drafted token the target ruled on with its acceptance-predictor features and verdict
(``drafted``, :class:`serving.engine.features.DraftedToken`), the output positions kept although
the target disagreed (``unverified``, relaxed verification only), and who produced it
(drafter and its version, policy, hardware target, sampling). Records whose acceptance
falls below the collection's threshold are *failure cases*; the rest feed the replay
buffer. Validation (``tasks/data/expectations.py``) also views the disagreements and the
drafted tokens as their own flat record types. The workload and split names live here too,
the lowest layer that needs them.

``RequestRecord`` is the structural contract: pydantic rejects missing fields, wrong types
and NaN/inf at parse time, with the field named in the reason. Its disagreements and drafted
tokens are the engine's own dataclasses (:class:`serving.engine.detailed.Disagreement`,
:class:`serving.engine.features.DraftedToken`), held to the same rules. Every reader goes through
:func:`parse_record`, which also reads the older versions still in users' stores and DVC
remotes (:func:`migrate_record`: version 1 had no ``drafted``/``unverified``, version 2 no
``masked_disagreements``); writers always write the current version.

Versions: 1, the first; 2 added ``drafted`` and ``unverified``; 3 added
``masked_disagreements`` (the disagreements redaction removed because a secret touched
them, :mod:`serving.security.redact`).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Annotated, Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetPydanticSchema
from pydantic_core import CoreSchema
from pydantic_core.core_schema import DataclassSchema

from serving.engine.detailed import DetailedRecord, Disagreement
from serving.engine.features import DraftedToken
from serving.errors import BadInputError

SCHEMA_VERSION: Literal[3] = 3
READABLE_VERSIONS = (1, 2, SCHEMA_VERSION)  # what parse_record reads; it returns SCHEMA_VERSION
DEFAULT_FAILURE_THRESHOLD = 0.5

# Workload and split names, declared once here for every layer above (traffic, params,
# validation, benchmarks, CLI). Traffic built from packaged data is one of ``WORKLOADS``;
# the server's capture writes ``LIVE_WORKLOAD``, always in the train split (live traffic is
# never evaluation data, which comes from the held-out workloads). A record's ``workload``
# and ``split`` stay plain strings: validation's expectations check them, with a reason.
Workload = Literal["sharegpt", "humaneval", "grounded"]
Split = Literal["train", "heldout"]
WORKLOADS: tuple[Workload, ...] = get_args(Workload)
SPLITS: tuple[Split, ...] = get_args(Split)
LIVE_WORKLOAD: Literal["live"] = "live"
RECORD_WORKLOADS: tuple[str, ...] = (*WORKLOADS, LIVE_WORKLOAD)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Sampling(_Strict):
    temperature: float
    top_k: int
    top_p: float
    seed: int | None


def _row(source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
    """An engine dataclass as a record's nested row, with the record's rules (a stdlib
    dataclass inside a model takes the model's config: strict, no extra keys, no NaN).
    Pydantic's strict mode takes a dataclass only as an instance, never as the JSON object a
    stored row is read from, so that one check is relaxed; an instance (the engine's, in
    :func:`from_detailed`) has its fields checked again."""
    schema = handler(source)
    resolved = handler.resolve_ref_schema(schema)
    if resolved["type"] != "dataclass":
        raise TypeError(f"{source!r} is not a dataclass: its schema is {resolved['type']!r}")
    dataclass_schema = cast(DataclassSchema, resolved)
    dataclass_schema["strict"] = False
    dataclass_schema["revalidate_instances"] = "always"
    return schema


_AS_ROW = GetPydanticSchema(_row)


class RequestRecord(_Strict):
    schema_version: Literal[3]
    id: str = Field(min_length=1)
    prompt_id: str
    workload: str  # one of RECORD_WORKLOADS (checked by validation, not at parse)
    split: str  # one of SPLITS (likewise)
    prompt: str
    prompt_token_ids: list[int]
    output_text: str
    output_token_ids: list[int]
    from_draft: list[bool]
    acceptance_rate: float | None  # None when nothing was drafted
    mean_accepted_length: float | None
    draft_tokens: int
    accepted_tokens: int
    checks: int
    steps: list[list[int]]  # [proposed, accepted] per target pass
    is_failure: bool
    failure_threshold: float
    drafter: str
    drafter_version: str
    policy: str
    hardware: str
    sampling: Sampling
    timestamp: float  # unix seconds
    run_id: str
    disagreements: list[Annotated[Disagreement, _AS_ROW]]
    # Per drafted token the target ruled on, in order (ranges are checked by validation).
    drafted: list[Annotated[DraftedToken, _AS_ROW]]
    unverified: list[int]  # output positions kept although the target disagreed (relaxed)
    # Disagreements removed by redaction: their draft or target token carried a secret, so
    # both would be the mask token (no disagreement left to learn from). >= 0 (validation).
    masked_disagreements: int = 0


class UnknownSchemaVersionError(BadInputError):
    """A record of a schema version this code cannot read (written by a newer specops)."""


def migrate_record(row: dict) -> dict:
    """``row`` (a raw record of any readable version) as a current-version dict.

    A version-1 record gains ``drafted=[]`` and ``unverified=[]``: version 1 never recorded
    per-token features, so an empty ``drafted`` there means *not recorded*, not *nothing
    drafted* (``draft_tokens`` still says how many were), and the acceptance predictor has
    nothing to learn from it. Versions 1 and 2 gain ``masked_disagreements=0``: they
    removed no disagreement (redaction masked both of its tokens instead, which
    validation refuses). A current record is returned as it is; so is one without
    ``schema_version``, which the schema then refuses by name. Any other version raises
    :class:`UnknownSchemaVersionError` naming it. ``row`` itself is never modified.
    """
    if "schema_version" not in row:
        return row
    version = row["schema_version"]
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise UnknownSchemaVersionError(
            f"schema_version: {version!r} is not a record version this code reads "
            f"(it reads {', '.join(map(str, READABLE_VERSIONS))}): a newer specops wrote "
            "it, or the row is damaged; upgrade specops to read it"
        )
    if version == 1:
        row = {**row, "drafted": [], "unverified": []}
    if version in (1, 2):
        return {**row, "schema_version": SCHEMA_VERSION, "masked_disagreements": 0}
    return row


def parse_record(row: object) -> RequestRecord:
    """Read one stored record, of any readable version, as the current schema.

    The one reader every consumer of stored records uses. Raises pydantic's
    ``ValidationError`` for a malformed record (a row that is not a JSON object included)
    and :class:`UnknownSchemaVersionError` for an unreadable version.
    """
    if isinstance(row, dict):
        row = migrate_record(row)
    return RequestRecord.model_validate(row)


def record_id(*parts: object) -> str:
    """A deterministic id: the same request in the same collection gets the same id, so a
    re-run after an interruption recognises what it already wrote."""
    text = json.dumps([str(p) for p in parts])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def is_failure(acceptance_rate: float | None, threshold: float) -> bool:
    """A failure case: drafts were proposed and fewer than ``threshold`` of them were kept."""
    return acceptance_rate is not None and acceptance_rate < threshold


def from_detailed(
    detailed: DetailedRecord,
    *,
    record_key: str,
    prompt_id: str,
    workload: str,
    split: str,
    prompt: str,
    output_text: str,
    drafter_version: str,
    hardware: str,
    run_id: str,
    failure_threshold: float = DEFAULT_FAILURE_THRESHOLD,
    timestamp: float | None = None,
) -> dict:
    """Build a current-version record (a plain dict, ready for JSON) from the engine's."""
    sampling = detailed.sampling
    record = RequestRecord(
        schema_version=SCHEMA_VERSION,
        id=record_key,
        prompt_id=prompt_id,
        workload=workload,
        split=split,
        prompt=prompt,
        prompt_token_ids=list(detailed.prompt_token_ids),
        output_text=output_text,
        output_token_ids=list(detailed.output_token_ids),
        from_draft=list(detailed.from_draft),
        acceptance_rate=detailed.acceptance_rate,
        mean_accepted_length=detailed.mean_accepted_length,
        draft_tokens=detailed.draft_tokens,
        accepted_tokens=detailed.accepted_tokens,
        checks=detailed.checks,
        steps=[list(step) for step in detailed.steps],
        is_failure=is_failure(detailed.acceptance_rate, failure_threshold),
        failure_threshold=failure_threshold,
        drafter=str(detailed.drafter.get("name", "none")),
        drafter_version=drafter_version,
        policy=str(detailed.policy.get("name", "none")),
        hardware=hardware,
        sampling=Sampling.model_validate(sampling),
        timestamp=time.time() if timestamp is None else timestamp,
        run_id=run_id,
        disagreements=list(detailed.disagreements),
        drafted=list(detailed.drafted),
        unverified=list(detailed.unverified),
    )
    return record.model_dump(mode="json")
