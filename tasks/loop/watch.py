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
a cost-aware policy still probes), or a champion never evaluated, is not judged. On a vLLM
target, whose server counts tokens per server and not per request, the windows its
deployment scraped while the champion served (:mod:`tasks.data.vllm_acceptance`) are judged
the same way, as its ``live`` workload. Settings: ``configs/retrain.yaml``'s ``watch``.

What follows a collapse is the registry's: :meth:`registry.client.Registry.rollback` with
the judged champion as the expected one (two collects racing move the alias once) and the
displaced version held out of promotion until an operator clears it
(``specops registry clear-rollback``); with no previous champion nothing moves and the
watch raises the alarm in the flow log instead. The deployments follow the alias: the
engine's servers swap drafts, a vLLM deployment starts a server with the restored champion
(:mod:`tasks.loop.vllm_deploy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from registry.acceptance import evaluated_acceptance
from serving.hardware import HardwareTarget
from serving.records.schema import RequestRecord
from tasks.data.vllm_acceptance import ScrapedAcceptance


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
    hardware: HardwareTarget,
    champion: str,
    champion_tags: Mapping[str, str],
    settings: WatchSettings,
) -> tuple[bool, list[str]]:
    """Whether ``champion`` collapsed on ``hardware``, and one line per judged workload
    (see the module docstring). ``records``: any valid records; only the ones
    ``champion`` served on ``hardware`` count."""
    name = hardware.name  # what records and the champion's tags carry
    served: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: (r.timestamp, r.id)):
        if record.hardware == name and record.drafter_version == champion:
            served.setdefault(record.workload, []).append(record)
    collapsed, reasons = False, []
    for workload, rows in sorted(served.items()):
        if len(rows) < settings.newest:
            continue
        newest = rows[-settings.newest :]
        verdict = _verdict(
            f"{workload}@{name}",
            champion,
            evaluated_acceptance(champion_tags, name, workload),
            drafted=sum(r.draft_tokens for r in newest),
            accepted=sum(r.accepted_tokens for r in newest),
            what=f"its newest {len(newest)} requests",
            share=settings.share,
        )
        if verdict is not None:
            collapsed |= verdict[0]
            reasons.append(verdict[1])
    return collapsed, reasons


def judge_scraped(
    group: ScrapedAcceptance | None,
    *,
    champion: str,
    champion_tags: Mapping[str, str],
    settings: WatchSettings,
) -> tuple[bool, list[str]]:
    """The same judgement on a vLLM target, whose server counts drafted and accepted tokens
    per server rather than per request: ``group`` pools the newest windows its deployment
    scraped while ``champion`` served (:func:`tasks.data.vllm_acceptance.vllm_groups` with
    ``window=settings.newest``), one ``live`` workload. None, or fewer than
    ``settings.newest`` requests: not judged."""
    if group is None or group.requests < settings.newest:
        return False, []
    verdict = _verdict(
        f"{group.workload}@{group.hardware}",
        champion,
        evaluated_acceptance(champion_tags, group.hardware, group.workload),
        drafted=group.draft_tokens,
        accepted=group.accepted_tokens,
        what=f"its newest {group.requests} requests (vLLM's counters)",
        share=settings.share,
    )
    return (False, []) if verdict is None else (verdict[0], [verdict[1]])


def _verdict(
    group: str,
    champion: str,
    expected: tuple[float, str] | None,
    *,
    drafted: int,
    accepted: int,
    what: str,
    share: float,
) -> tuple[bool, str] | None:
    """Whether ``accepted / drafted`` over ``what`` fell below ``share`` of ``expected``
    (what the champion's evaluation measured, and where), and the line saying so; None
    when never evaluated there."""
    if expected is None:
        return None
    if not drafted:  # a lookup that found nothing to look up: no evidence either way
        return False, f"{group}: {champion} drafted nothing over {what}: not judged"
    live = accepted / drafted
    floor = share * expected[0]
    low = live < floor
    return low, (
        f"{group}: {champion} accepted {live:.3f} over {what}, {'<' if low else '>='} "
        f"{floor:.3f} ({share:g} x {expected[0]:.3f} accepted on {expected[1]})"
    )
