"""Rolling acceptance per workload and hardware target, and whether a retrain is wanted.

Acceptance is pooled over the last ``window`` requests of each (workload, hardware) group,
``sum(accepted_tokens) / sum(draft_tokens)`` (requests that drafted nothing carry no
evidence). A group whose rolling acceptance is below ``threshold`` wants a retrain.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from serving.records.schema import RequestRecord


class PooledAcceptance(BaseModel):
    """One (workload, hardware) group's acceptance pooled over its newest requests: what
    :func:`tasks.loop.triggers.decide_retrain` weighs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str
    hardware: str
    requests: int  # in the window
    draft_tokens: int
    accepted_tokens: int
    acceptance: float | None


class GroupWindow(PooledAcceptance):
    """A group of the engine's records, judged against an absolute threshold."""

    retrain_wanted: bool


class GroupAcceptance(GroupWindow):
    """The window, and how it moved: the rolling acceptance after each request."""

    series: list[float | None]  # rolling acceptance after each request, oldest first

    def window(self) -> GroupWindow:
        return GroupWindow(**self.model_dump(exclude={"series"}))


def _pooled(rows: Sequence[RequestRecord]) -> tuple[int, int, float | None]:
    drafted = sum(r.draft_tokens for r in rows)
    accepted = sum(r.accepted_tokens for r in rows)
    return drafted, accepted, (accepted / drafted if drafted else None)


def rolling_acceptance(
    records: Sequence[RequestRecord], *, window: int = 50, threshold: float = 0.5
) -> list[GroupAcceptance]:
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    groups: dict[tuple[str, str], list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: (r.timestamp, r.id)):
        groups.setdefault((record.workload, record.hardware), []).append(record)
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
