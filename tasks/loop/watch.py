"""The watched champion: after a promotion, ``collect`` compares what the champion accepts
on live traffic with what its evaluation predicted, and restores the previous champion when
it collapsed.

A champion whose files were damaged, or whose traffic drifted right after its promotion,
can fall to accepting nothing while serving goes on, slower than plain decoding, and the
retrain trigger (:mod:`tasks.loop.triggers`) would only retrain it — after its cool-down.
Here, per workload, over the newest ``newest`` requests the champion itself served, its
pooled acceptance is compared with what it accepted when evaluated on that workload (its
held-out traffic slice first: :func:`registry.acceptance.evaluated_acceptance`); below
``share`` of it, the champion collapsed. A group with fewer requests, one where it drafted
nothing at all (a lookup that found nothing to look up: a broken draft still proposes, and
a cost-aware policy still probes), or a champion never evaluated, is not judged. Settings:
``configs/retrain.yaml``'s ``watch``.

What follows a collapse is the registry's: :meth:`registry.client.Registry.rollback` with
the judged champion as the expected one (two collects racing move the alias once) and the
displaced version held out of promotion until an operator clears it
(``specops registry clear-rollback``); with no previous champion nothing moves and the
watch raises the alarm in the flow log instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from registry.acceptance import evaluated_acceptance
from serving.records.schema import RequestRecord


class WatchSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    newest: int = Field(default=12, ge=1)  # the champion's newest requests per workload
    share: float = Field(default=0.5, gt=0, le=1)  # of its evaluated acceptance


class Watch(BaseModel):
    """What the watch saw and did (in ``collect``'s flow result as ``watch``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    champion: str | None
    collapsed: bool
    reasons: list[str]  # one line per judged workload
    rolled_back_to: str | None = None  # the restored champion's label
    alarm: str | None = None  # collapsed, and nothing could be restored: why


def judge(
    records: Sequence[RequestRecord],
    *,
    hardware: str,
    champion: str,
    champion_tags: Mapping[str, str],
    settings: WatchSettings,
) -> tuple[bool, list[str]]:
    """Whether ``champion`` collapsed on ``hardware``, and one line per judged workload
    (see the module docstring). ``records``: any valid records; only the ones
    ``champion`` served on ``hardware`` count."""
    served: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: (r.timestamp, r.id)):
        if record.hardware == hardware and record.drafter_version == champion:
            served.setdefault(record.workload, []).append(record)
    collapsed, reasons = False, []
    for workload, rows in sorted(served.items()):
        if len(rows) < settings.newest:
            continue
        expected = evaluated_acceptance(champion_tags, hardware, workload)
        if expected is None:
            continue
        newest = rows[-settings.newest :]
        drafted = sum(r.draft_tokens for r in newest)
        accepted = sum(r.accepted_tokens for r in newest)
        if not drafted:  # a lookup that found nothing to look up: no evidence either way
            reasons.append(
                f"{workload}@{hardware}: {champion} drafted nothing over its newest "
                f"{len(newest)} requests: not judged"
            )
            continue
        live = accepted / drafted
        floor = settings.share * expected[0]
        low = live < floor
        collapsed |= low
        reasons.append(
            f"{workload}@{hardware}: {champion} accepted {live:.3f} over its newest "
            f"{len(newest)} requests, {'<' if low else '>='} {floor:.3f} "
            f"({settings.share:g} x {expected[0]:.3f} accepted on {expected[1]})"
        )
    return collapsed, reasons
