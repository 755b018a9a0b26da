"""The training dataset built from validated records.

- ``failures``: train-split requests whose acceptance fell below their threshold;
- ``replay``: train-split successes, sampled so that the training mix is
  ``failure_share`` failures and the rest replay (80/20 by default) - the replay buffer
  guards the draft against forgetting what it already did well;
- ``train_mix``: failures + replay, in a seeded order;
- ``eval``: every held-out-split request (never trained on).

Derived data: rebuilt whole from the validated records each run, written atomically.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from serving.atomic import write_jsonl_atomic

# The dataset's parts, one JSONL file each (not to be confused with the train/held-out splits
# of traffic, serving.records.schema.SPLITS: every part but `eval` comes from the train split).
PARTS = ("failures", "replay", "train_mix", "eval")


def _rank(seed: int, record_id: str) -> str:
    return hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()


def build_dataset(
    records: Sequence[dict], *, failure_share: float = 0.8, seed: int = 0
) -> dict[str, list[dict]]:
    if not 0.0 < failure_share <= 1.0:
        raise ValueError(f"failure_share must be in (0, 1], got {failure_share!r}")
    train = [r for r in records if r["split"] == "train"]
    failures = [r for r in train if r["is_failure"]]
    successes = sorted(
        (r for r in train if not r["is_failure"]), key=lambda r: _rank(seed, r["id"])
    )
    wanted = round(len(failures) * (1.0 - failure_share) / failure_share)
    replay = successes[:wanted]
    mix = sorted(failures + replay, key=lambda r: _rank(seed + 1, r["id"]))
    return {
        "failures": failures,
        "replay": replay,
        "train_mix": mix,
        "eval": [r for r in records if r["split"] == "heldout"],
    }


def write_dataset(dataset: dict[str, list[dict]], out_dir: Path) -> dict[str, int]:
    counts = {}
    for name in PARTS:
        counts[name] = write_jsonl_atomic(Path(out_dir) / f"{name}.jsonl", dataset[name])
    return counts
