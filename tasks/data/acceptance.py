"""Rolling acceptance per workload and hardware target, and whether a retrain is wanted.

Acceptance is pooled over the last ``window`` requests of each (workload, hardware) group,
``sum(accepted_tokens) / sum(draft_tokens)`` (requests that drafted nothing carry no
evidence). A group whose rolling acceptance is below ``threshold`` wants a retrain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GroupAcceptance:
    workload: str
    hardware: str
    requests: int  # in the window
    draft_tokens: int
    accepted_tokens: int
    acceptance: float | None
    retrain_wanted: bool
    series: list[float | None]  # rolling acceptance after each request, oldest first

    def to_dict(self) -> dict:
        return asdict(self)


def _pooled(rows: Sequence[dict]) -> tuple[int, int, float | None]:
    drafted = sum(r["draft_tokens"] for r in rows)
    accepted = sum(r["accepted_tokens"] for r in rows)
    return drafted, accepted, (accepted / drafted if drafted else None)


def rolling_acceptance(
    records: Sequence[dict], *, window: int = 50, threshold: float = 0.5
) -> list[GroupAcceptance]:
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    groups: dict[tuple[str, str], list[dict]] = {}
    for record in sorted(records, key=lambda r: (r["timestamp"], r["id"])):
        groups.setdefault((record["workload"], record["hardware"]), []).append(record)
    out = []
    for (workload, hardware), rows in sorted(groups.items()):
        series = [_pooled(rows[max(0, i + 1 - window) : i + 1])[2] for i in range(len(rows))]
        recent = rows[-window:]
        drafted, accepted, acceptance = _pooled(recent)
        out.append(
            GroupAcceptance(
                workload=workload,
                hardware=hardware,
                requests=len(recent),
                draft_tokens=drafted,
                accepted_tokens=accepted,
                acceptance=acceptance,
                retrain_wanted=acceptance is not None and acceptance < threshold,
                series=series,
            )
        )
    return out
