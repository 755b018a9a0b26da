"""Rolling acceptance of a vLLM hardware target, from the windows its deployment scraped.

vLLM counts drafted and accepted tokens per server, not per request, so
:mod:`tasks.loop.vllm_deploy` stores what its counters moved by between two readings
(``vllm-acceptance/`` parts, :mod:`serving.gateway.scrape`). Pooled over the newest windows
that add up to ``window`` requests, they give the same ``accepted / drafted`` the engine's
records give, as one ``live`` group of that hardware target, which
:func:`tasks.loop.triggers.decide_retrain` weighs like any other group.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from serving.gateway.sink import ACCEPTANCE, area_parts
from serving.hardware import HardwareTarget
from serving.records.schema import LIVE_WORKLOAD
from tasks.data.acceptance import PooledAcceptance

# One window as its deployment stored it: ``end`` (unix seconds), ``champion`` (the label that
# served), ``requests``, ``draft_tokens``, ``accepted_tokens``, and what else the scrape kept.
ScrapedWindow = dict[str, Any]


class ScrapedAcceptance(PooledAcceptance):
    """A vLLM target's ``live`` group, pooled from its scraped windows."""

    source: Literal["vllm-metrics"] = "vllm-metrics"


def read_windows(store: Path, hardware: HardwareTarget) -> list[ScrapedWindow]:
    """Every scraped window of ``hardware``, oldest first; unreadable lines are skipped
    (a window is a measurement, not a record to quarantine)."""
    rows = []
    for part in area_parts(store, ACCEPTANCE, hardware):
        for line in part.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and {"end", "draft_tokens", "accepted_tokens"} <= set(row):
                rows.append(row)
    return sorted(rows, key=lambda r: r["end"])


def vllm_groups(
    store: Path, hardware: HardwareTarget, *, champion: str | None, window: int = 50
) -> list[ScrapedAcceptance]:
    """The ``live`` group of ``hardware``'s newest windows served by ``champion`` (all
    champions when None) covering at least ``window`` requests; [] without windows."""
    return pooled_windows(read_windows(store, hardware), hardware, champion=champion, window=window)


def pooled_windows(
    windows: Sequence[ScrapedWindow],
    hardware: HardwareTarget,
    *,
    champion: str | None,
    window: int = 50,
) -> list[ScrapedAcceptance]:
    """:func:`vllm_groups` over ``windows`` already read (:func:`read_windows`, oldest
    first); the group carries ``hardware``'s name."""
    rows = [r for r in windows if champion is None or r["champion"] == champion]
    taken: list[ScrapedWindow] = []
    for row in reversed(rows):
        taken.append(row)
        if sum(int(r.get("requests", 0)) for r in taken) >= window:
            break
    if not taken:
        return []
    drafted = sum(int(r["draft_tokens"]) for r in taken)
    accepted = sum(int(r["accepted_tokens"]) for r in taken)
    return [
        ScrapedAcceptance(
            workload=LIVE_WORKLOAD,
            hardware=hardware.name,
            requests=sum(int(r.get("requests", 0)) for r in taken),
            draft_tokens=drafted,
            accepted_tokens=accepted,
            acceptance=accepted / drafted if drafted else None,
        )
    ]
