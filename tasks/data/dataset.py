"""The training dataset built from validated records.

- ``failures``: trainable requests whose acceptance fell below their threshold;
- ``replay``: trainable successes, sampled so that the training mix is ``failure_share``
  failures and the rest replay (80/20 by default) - the replay buffer guards the draft
  against forgetting what it already did well;
- ``train_mix``: failures + replay, in a seeded order;
- ``trainable``: every trainable request as it came (not failure-enriched): what the
  acceptance predictor learns from, so that its probabilities match real traffic;
- ``eval``: every held-out-split request (never trained on);
- ``heldout_traffic``: the newest ``heldout_share`` of each workload's train-split requests
  (:func:`holdout_by_time`), never trained on either.

*Trainable* means train split and not in ``heldout_traffic``. The two held-out parts answer
different questions: ``eval`` holds prompts that a hash of their id keeps out of training
for good (built-in workloads only), while ``heldout_traffic`` is the most recent traffic,
including captured ``live`` traffic, which has no hash split: a draft is judged on the
traffic that came after what it learned from, as it will be once it serves.

Derived data: rebuilt whole from the validated records each run, written atomically;
read back as records by :func:`read_part`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from pydantic import ValidationError

from serving.atomic import write_jsonl_atomic
from serving.errors import BadInputError
from serving.records.schema import RequestRecord, UnknownSchemaVersionError, parse_record

# The dataset's parts, one JSONL file each (not to be confused with the train/held-out splits
# of traffic, serving.records.schema.SPLITS: `failures`, `replay` and `train_mix` come from
# the trainable records, `heldout_traffic` from the rest of the train split, `eval` from the
# held-out split).
PARTS = ("failures", "replay", "train_mix", "trainable", "eval", "heldout_traffic")

# The newest fifth of each workload's train-split traffic is held out by default
# (params.yaml `dataset.heldout_share`).
DEFAULT_HELDOUT_SHARE = 0.2


def _rank(seed: int, record_id: str) -> str:
    return hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()


def _held_out_count(n: int, share: float) -> int:
    """How many of a workload's ``n`` train-split records are held out: ``ceil(share * n)``,
    but never all of them, so the oldest record of every workload trains (a lone record
    is never held out). ``share * n`` is rounded to 9 decimals first, so that a product
    like ``0.7 * 10 = 7.000000000000001`` does not round up to 8."""
    return min(math.ceil(round(share * n, 9)), max(n - 1, 0))


def check_heldout_share(share: float) -> None:
    """:class:`BadInputError` naming ``share`` unless it is in [0, 1)."""
    if not 0.0 <= share < 1.0:  # also rejects NaN
        raise BadInputError(
            f"heldout_share must be in [0, 1), got {share!r}; 0 holds nothing out, and "
            "some traffic must stay trainable"
        )


def holdout_by_time(
    records: Sequence[RequestRecord], share: float
) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """``(trainable, heldout_traffic)``: the train-split ``records`` split by time.

    Per workload, the train-split records are ordered by ``(timestamp, id)`` (the id breaks
    ties, so the split does not depend on the order records were read in) and the newest
    ``ceil(share * n)`` of the workload's ``n`` are held out; at least one record of each
    workload stays trainable, so a workload with a single record is not held out at all.
    ``share == 0`` holds out nothing.

    Records of the ``heldout`` split are in neither list (they are the ``eval`` part).
    ``trainable`` keeps the input order; ``heldout_traffic`` is in time order.
    """
    check_heldout_share(share)
    train = [r for r in records if r.split == "train"]
    by_workload: dict[str, list[int]] = {}
    for index, record in enumerate(train):
        by_workload.setdefault(record.workload, []).append(index)
    held: set[int] = set()
    for indices in by_workload.values():
        count = _held_out_count(len(indices), share)
        if count:
            newest_last = sorted(indices, key=lambda i: (train[i].timestamp, train[i].id))
            held.update(newest_last[-count:])
    trainable = [r for i, r in enumerate(train) if i not in held]
    heldout = sorted((train[i] for i in held), key=lambda r: (r.timestamp, r.id))
    return trainable, heldout


def heldout_traffic_records(
    records: Sequence[RequestRecord], share: float = DEFAULT_HELDOUT_SHARE
) -> list[RequestRecord]:
    """The held-out slice of ``records`` (validated records): the newest ``share`` of each
    workload's train-split traffic, in time order - what a draft is evaluated on and was
    never trained on (:func:`holdout_by_time`, which ``build_dataset`` uses with the same
    rule)."""
    return holdout_by_time(records, share)[1]


@dataclass(frozen=True)
class Dataset:
    """The parts of :data:`PARTS`, in that order (see the module docstring)."""

    failures: list[RequestRecord]
    replay: list[RequestRecord]
    train_mix: list[RequestRecord]
    trainable: list[RequestRecord]
    eval: list[RequestRecord]
    heldout_traffic: list[RequestRecord]

    def parts(self) -> dict[str, list[RequestRecord]]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def build_dataset(
    records: Sequence[RequestRecord],
    *,
    failure_share: float = 0.8,
    seed: int = 0,
    heldout_share: float = DEFAULT_HELDOUT_SHARE,
) -> Dataset:
    """Every part of :data:`PARTS` from validated ``records`` (see the module docstring)."""
    if not 0.0 < failure_share <= 1.0:
        raise ValueError(f"failure_share must be in (0, 1], got {failure_share!r}")
    trainable, heldout_traffic = holdout_by_time(records, heldout_share)
    failures = [r for r in trainable if r.is_failure]
    successes = sorted((r for r in trainable if not r.is_failure), key=lambda r: _rank(seed, r.id))
    wanted = round(len(failures) * (1.0 - failure_share) / failure_share)
    replay = successes[:wanted]
    mix = sorted(failures + replay, key=lambda r: _rank(seed + 1, r.id))
    return Dataset(
        failures=failures,
        replay=replay,
        train_mix=mix,
        trainable=list(trainable),
        eval=[r for r in records if r.split == "heldout"],
        heldout_traffic=heldout_traffic,
    )


def write_dataset(dataset: Dataset, out_dir: Path) -> dict[str, int]:
    """Each part as ``<part>.jsonl`` (the records' JSON), atomically; the row counts."""
    return {
        name: write_jsonl_atomic(
            Path(out_dir) / f"{name}.jsonl", (r.model_dump(mode="json") for r in records)
        )
        for name, records in dataset.parts().items()
    }


def part_path(dataset_dir: str | Path, part: str) -> Path:
    return Path(dataset_dir) / f"{part}.jsonl"


def read_part(dataset_dir: str | Path, part: str) -> list[RequestRecord]:
    """The records of one dataset part (one of :data:`PARTS`), as written by
    :func:`write_dataset`; :class:`BadInputError` names a missing file or a bad line."""
    if part not in PARTS:
        raise BadInputError(f"no dataset part {part!r}: the parts are {', '.join(PARTS)}")
    path = part_path(dataset_dir, part)
    if not path.is_file():
        raise BadInputError(
            f"no dataset part at {str(path)!r}: build the dataset first (`specops data "
            "validate --out DIR`, `dvc repro validate`, or the loop's validate step)"
        )
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(parse_record(json.loads(line)))
        except json.JSONDecodeError as error:
            raise BadInputError(f"{path}:{number} is not JSON ({error})") from None
        except ValidationError as error:
            fields = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
            raise BadInputError(
                f"{path}:{number} is not a request record ({fields}); rebuild the dataset "
                "with `specops data validate`"
            ) from None
        except UnknownSchemaVersionError as error:
            raise BadInputError(f"{path}:{number}: {error}") from None
    return records
