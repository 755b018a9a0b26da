"""The acceptance predictor's rows: every drafted token of the validated records, labelled.

A detailed-mode record (schema v2, :class:`serving.records.schema.RequestRecord`) carries
``drafted``: one row per drafted token the target ruled on, with
:class:`~serving.engine.features.DraftedToken`'s fields. A predictor row is its
:class:`~serving.engine.features.TokenFeatures` (the row's fields of those names) and its label,
``accepted`` (the target agreed). A version-1 record has no ``drafted`` (the schema's
migration gives it an empty list): it adds no rows.

Which dataset parts (:mod:`tasks.data.dataset`) a predictor learns from and is judged on:

- **train**: :data:`TRAIN_PARTS`, ``trainable``: every validated trainable request as it
  came. Not ``train_mix``, which the learned drafts train on: that mix is failure-enriched
  (``failure_share`` of its requests are failures), and a predictor trained on it would
  put acceptance below what the traffic has - its probabilities must be calibrated.
- **held-out**: :data:`HELDOUT_PARTS`, ``eval`` (the held-out prompts) and
  ``heldout_traffic`` (the newest traffic of each workload): never trained on.

Only records collected on the predictor's hardware target count: acceptance depends on the
target's kernels (a quantised target disagrees more often), so each target has its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from serving.engine.features import TokenFeatures
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.records.schema import RequestRecord
from tasks.data.dataset import part_path, read_part

TRAIN_PARTS = ("trainable",)
HELDOUT_PARTS = ("eval", "heldout_traffic")
FEATURE_FIELDS = tuple(f.name for f in fields(TokenFeatures))
NO_ROWS_HINT = (
    "collect in detailed mode with schema v2 (`specops data collect`, or the loop's "
    "collect step), then `specops data validate` to rebuild the dataset"
)


@dataclass(frozen=True)
class LabelledRows:
    """Feature rows, their labels, and the request each came from."""

    features: list[TokenFeatures]
    labels: list[bool]  # the target accepted the drafted token
    groups: list[str]  # the record id of each row: a validation slice takes whole requests
    records: int = 0  # records read (every hardware target)
    records_here: int = 0  # of them, collected on the hardware target asked for
    unrecorded: int = 0  # of those, drafted tokens but kept no rows (collected before v2)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def accepted(self) -> int:
        return sum(self.labels)

    def stages(self) -> list[str]:
        return sorted(set(row.stage for row in self.features))

    def take(self, indices: Sequence[int]) -> LabelledRows:
        """The rows at ``indices`` (the record counts are not carried over)."""
        return LabelledRows(
            [self.features[i] for i in indices],
            [self.labels[i] for i in indices],
            [self.groups[i] for i in indices],
        )


def row_features(row: object) -> TokenFeatures:
    """The :class:`TokenFeatures` of a drafted row (a record's ``drafted`` entry, or a
    :class:`~serving.engine.features.DraftedToken`): its fields of those names."""
    return TokenFeatures(**{name: getattr(row, name) for name in FEATURE_FIELDS})


def drafted_rows(records: Iterable[RequestRecord], *, hardware: HardwareTarget) -> LabelledRows:
    """Every drafted row of the ``records`` collected on ``hardware``, labelled."""
    features: list[TokenFeatures] = []
    labels: list[bool] = []
    groups: list[str] = []
    read = here = unrecorded = 0
    for record in records:
        read += 1
        if record.hardware != hardware.name:
            continue
        here += 1
        if not record.drafted and record.draft_tokens > 0:
            unrecorded += 1
        for row in record.drafted:
            features.append(row_features(row))
            labels.append(row.accepted)
            groups.append(record.id)
    return LabelledRows(features, labels, groups, read, here, unrecorded)


def read_parts(dataset_dir: str | Path, parts: Sequence[str]) -> list[RequestRecord]:
    """The records of the dataset ``parts`` (written by ``specops data validate``)."""
    return [record for part in parts for record in read_part(dataset_dir, part)]


def dataset_rows(
    dataset_dir: str | Path, parts: Sequence[str], *, hardware: HardwareTarget
) -> LabelledRows:
    return drafted_rows(read_parts(dataset_dir, parts), hardware=hardware)


def training_rows(dataset_dir: str | Path, *, hardware: HardwareTarget) -> LabelledRows:
    """The training rows (:data:`TRAIN_PARTS`), refused unless both labels occur."""
    rows = dataset_rows(dataset_dir, TRAIN_PARTS, hardware=hardware)
    check_rows(rows, hardware=hardware, what=f"the training parts {list(TRAIN_PARTS)}")
    if rows.accepted in (0, len(rows)):
        verdict = "accepted" if rows.accepted else "rejected"
        raise BadInputError(
            f"all {len(rows)} drafted rows of the training parts were {verdict}: the "
            "predictor needs both outcomes to learn from; collect more traffic (or with a "
            "drafter whose tokens the target sometimes rejects)"
        )
    return rows


def heldout_rows(dataset_dir: str | Path, *, hardware: HardwareTarget) -> LabelledRows:
    """The held-out rows (:data:`HELDOUT_PARTS`), refused when there are none."""
    rows = dataset_rows(dataset_dir, HELDOUT_PARTS, hardware=hardware)
    check_rows(rows, hardware=hardware, what=f"the held-out parts {list(HELDOUT_PARTS)}")
    return rows


def check_rows(rows: LabelledRows, *, hardware: HardwareTarget, what: str) -> None:
    """:class:`BadInputError` saying why ``rows`` is empty, and what to do."""
    if len(rows):
        return
    name = hardware.name
    if rows.records == 0:
        found = "no records"
    elif rows.records_here == 0:
        found = f"{rows.records} records, none collected on hardware target {name!r}"
    elif rows.unrecorded:
        found = (
            f"{rows.records_here} records of {name!r}, none with drafted rows "
            f"({rows.unrecorded} of them drafted, but were collected before schema v2, "
            "which kept no per-token rows)"
        )
    else:
        found = f"{rows.records_here} records of {name!r}, none with a drafted token"
    raise BadInputError(f"no drafted rows in {what}: {found}; {NO_ROWS_HINT}")


def validation_split(
    rows: LabelledRows, fraction: float, *, seed: int = 0
) -> tuple[LabelledRows, LabelledRows]:
    """``(fit, validation)`` by whole requests: a seeded hash of the record id puts about
    ``fraction`` of them in the validation slice (at least one when there are two or more,
    never all). The tokens of one request are alike, so splitting rows would leak."""
    if not 0.0 <= fraction < 1.0:
        raise BadInputError(f"validation_fraction must be in [0, 1), got {fraction!r}")
    ids = sorted(set(rows.groups))

    def key(record_id: str) -> float:
        digest = hashlib.sha256(f"predictor-validation:{seed}:{record_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    held = {i for i in ids if key(i) < fraction} if fraction > 0 else set()
    if fraction > 0 and not held and len(ids) >= 2:
        held = {min(ids, key=key)}
    if len(held) == len(ids):
        held.discard(max(held, key=key))
    fit = [i for i, group in enumerate(rows.groups) if group not in held]
    validation = [i for i, group in enumerate(rows.groups) if group in held]
    return rows.take(fit), rows.take(validation)


def dataset_version(dataset_dir: str | Path, parts: Sequence[str]) -> str:
    """``dataset:<sha256>`` over the ``parts`` files (name and bytes): which data a
    predictor was trained and judged on, for its lineage tag."""
    digest = hashlib.sha256()
    for part in parts:
        path = part_path(dataset_dir, part)
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return f"dataset:{digest.hexdigest()[:16]}"
