"""Shadow scores: what each registered draft would have accepted on the newest live traffic.

``collect`` replays the champion, the previous champion and the registered challengers of a
hardware target over the newest captured greedy records of each workload, against the
target *as recorded* (:func:`tasks.evaluate.pregate.predict`: every pass returns the token
the target gave, so an n-gram or suffix draft's steps are exactly those of a real run on
that request; a head or LoRA draft drafts on the recorded context, with one teacher-forced
target pass per record for a head's features). Each contender's steps are priced with the
target's verify curve and the contender's drafting cost (from its evaluation on the target,
else profiled here) into a modelled speedup over plain decoding.

How they differ from measured figures: nothing is timed (the speedups are modelled, as the
gates model them); the outputs are the target's as served, so a sampled request (not
replayable exactly) and a redacted one (its secrets are the mask token, which no draft
proposes) are left out and counted; and the records are the live traffic's, not the
held-out evaluation prompts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from serving.hardware import HardwareTarget
from serving.records.schema import RequestRecord
from serving.security.redact import PLACEHOLDER
from serving.target import LoadedTarget
from tasks.evaluate.costs import fix_draft_cost, profile_draft_cost
from tasks.evaluate.evaluate import Contender, contender_decoders
from tasks.evaluate.pregate import predict

log = logging.getLogger(__name__)

REDACTED = PLACEHOLDER.split("{", 1)[0]  # "[REDACTED:"
PROFILE_TOKENS = 24  # per record while profiling a drafting cost nothing recorded


class ShadowSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    newest: int = Field(default=8, ge=1)  # the newest replayable records per workload


class ShadowScore(BaseModel):
    """One contender on one workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    role: str  # champion, previous champion, challenger
    workload: str
    records: int
    acceptance_rate: float | None  # None when it drafted nothing
    mean_accepted_length: float
    modelled_speedup: float | None
    draft_cost: float | None  # one drafted token, in one-token target passes


class Shadow(BaseModel):
    """What ``collect``'s shadow step replayed (in its flow result as ``shadow``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hardware: str
    scores: list[ShadowScore]
    skipped: dict[str, int]  # records left out, by reason
    run_id: str | None = None  # the MLflow run holding them
    error: str | None = None  # why none were computed (collect goes on without them)


def replayable(
    records: Sequence[RequestRecord], *, hardware: HardwareTarget
) -> tuple[list[RequestRecord], dict[str, int]]:
    """The records of ``hardware`` a replay reproduces, and the others counted by reason."""
    kept: list[RequestRecord] = []
    skipped: dict[str, int] = {}

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for record in records:
        if record.hardware != hardware.name:
            continue
        if record.sampling.temperature > 0:
            skip("sampled")
        elif REDACTED in record.prompt or REDACTED in record.output_text:
            skip("redacted")
        elif not record.prompt_token_ids or not record.output_token_ids:
            skip("empty")
        else:
            kept.append(record)
    return kept, skipped


def newest_by_workload(
    records: Sequence[RequestRecord], newest: int
) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: (r.timestamp, r.id)):
        groups.setdefault(record.workload, []).append(record)
    return {workload: rows[-newest:] for workload, rows in sorted(groups.items())}


def shadow_scores(
    records: Sequence[RequestRecord],
    contenders: Mapping[str, tuple[str, Path, Mapping[str, str]]],
    *,
    target: LoadedTarget,
    settings: ShadowSettings,
) -> tuple[list[ShadowScore], dict[str, int]]:
    """Every contender's :class:`ShadowScore` per workload on ``target``'s hardware target
    (see the module docstring), and the records left out by reason. ``contenders``: label
    -> (role, draft package folder, its version's tags, where ``<hardware>/draft_cost`` is
    its evaluated drafting cost)."""
    hardware = target.hardware
    kept, skipped = replayable(records, hardware=hardware)
    groups = newest_by_workload(kept, settings.newest)
    if not groups or not contenders:
        return [], skipped
    built = contender_decoders(
        [Contender(label, package) for label, (_, package, _) in contenders.items()], target
    )
    curve = list(target.hardware.curve)
    prompts = [r.prompt_token_ids for rows in groups.values() for r in rows]
    costs: dict[str, float] = {}
    for label, (_, _, tags) in contenders.items():
        decoder, k = built[label]
        cost = _evaluated_cost(tags, hardware)
        if cost is None and decoder.drafter is not None:
            cost, _ = profile_draft_cost(
                decoder, prompts, curve=curve, k=max(k, 1), max_new_tokens=PROFILE_TOKENS
            )
        if cost is not None:
            costs[label] = cost
            fix_draft_cost(decoder, cost)
    scores: list[ShadowScore] = []
    for workload, rows in groups.items():
        predictions = predict(
            {label: decoder for label, (decoder, _) in built.items()},
            [r.prompt_token_ids for r in rows],
            [r.output_token_ids for r in rows],
            target=target,
            curve=curve,
            draft_costs=costs,
        )
        for label, (role, _, _) in contenders.items():
            made = predictions[label]
            scores.append(
                ShadowScore(
                    label=label,
                    role=role,
                    workload=workload,
                    records=len(rows),
                    acceptance_rate=made.accepted / made.drafted if made.drafted else None,
                    mean_accepted_length=made.tokens / made.checks if made.checks else 1.0,
                    modelled_speedup=made.speedup,
                    draft_cost=costs.get(label),
                )
            )
    return scores, skipped


def _evaluated_cost(tags: Mapping[str, str], hardware: HardwareTarget) -> float | None:
    try:
        return float(tags[f"{hardware.name}/draft_cost"])
    except (KeyError, ValueError):
        return None


def as_metrics(scores: Sequence[ShadowScore]) -> dict[str, float]:
    """The scores as MLflow metrics, ``<label>/<workload>/<metric>``."""
    metrics: dict[str, float] = {}
    for score in scores:
        key = f"{score.label}/{score.workload}"
        metrics[f"{key}/records"] = float(score.records)
        metrics[f"{key}/mean_accepted_length"] = score.mean_accepted_length
        if score.acceptance_rate is not None:
            metrics[f"{key}/acceptance_rate"] = score.acceptance_rate
        if score.modelled_speedup is not None:
            metrics[f"{key}/modelled_speedup"] = score.modelled_speedup
    return metrics
