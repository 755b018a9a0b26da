"""Speculative-decoding metrics, defined once.

The CLI, the benchmark, the server's ``/metrics``, MLflow and the evaluation gates all read
these definitions. Per request, with ``checks`` target verification passes:

- ``draft_tokens``: drafts proposed, summed over checks.
- ``accepted_tokens``: drafts the target kept.
- ``acceptance_rate = accepted_tokens / draft_tokens`` (``None`` when nothing was drafted).
- ``mean_accepted_length = generated_tokens / checks``: tokens gained per target pass, the
  target's own (bonus or correction) token included; plain decoding scores 1.0. As in
  vLLM this is ``1 + accepted_tokens / checks`` except where EOS or the token budget cut a
  step short.
- ``acceptance_by_position[i]``: among checks that proposed at least ``i + 1`` drafts, the
  share whose draft ``i`` (0-based) was kept (``None`` where no check got that far).
- ``tokens_per_s = generated_tokens / total_s``, ``total_s`` from the request's start
  (prefill included) to its last token; ``draft_s`` and ``verify_s`` sum the time spent
  proposing and in the target's verification passes (verdict included).
- ``accepted_by_stage``: ``accepted_tokens`` by the stage that drafted them (``pld``,
  ``head``, ...): what each stage of a cascade contributed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One draft -> verify step, as the engine saw it."""

    proposed: int  # drafts sent to the target
    accepted: int  # drafts kept
    emitted: int  # tokens this step added to the output (EOS / budget may cut it short)
    draft_s: float
    verify_s: float
    stage: str | None = None  # the stage whose drafts it verified; None: it drafted nothing


@dataclass(frozen=True)
class RequestStats:
    prompt_tokens: int
    generated_tokens: int
    checks: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    mean_accepted_length: float | None
    acceptance_by_position: list[float | None]
    prefill_s: float
    draft_s: float
    verify_s: float
    total_s: float
    tokens_per_s: float | None
    # Accepted drafts by the stage that drafted them (suffix, pld, ngram, head, model): a
    # cascade's or a mixed drafter's share per stage.
    accepted_by_stage: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def position_counts(steps: Sequence[StepRecord]) -> tuple[list[int], list[int]]:
    """``(reached, kept)`` by draft position: checks that proposed a draft there, and those
    whose draft there was kept (the counts behind ``acceptance_by_position``)."""
    longest = max((s.proposed for s in steps), default=0)
    reached = [0] * longest
    kept = [0] * longest
    for step in steps:
        for i in range(step.proposed):
            reached[i] += 1
            kept[i] += i < step.accepted
    return reached, kept


def acceptance_by_position(steps: Sequence[StepRecord]) -> list[float | None]:
    reached, kept = position_counts(steps)
    return [_ratio(k, r) for k, r in zip(kept, reached, strict=True)]


def summarize(
    steps: Sequence[StepRecord], *, prompt_tokens: int, prefill_s: float, total_s: float
) -> RequestStats:
    generated = sum(s.emitted for s in steps)
    drafted = sum(s.proposed for s in steps)
    accepted = sum(s.accepted for s in steps)
    return RequestStats(
        prompt_tokens=prompt_tokens,
        generated_tokens=generated,
        checks=len(steps),
        draft_tokens=drafted,
        accepted_tokens=accepted,
        acceptance_rate=_ratio(accepted, drafted),
        mean_accepted_length=_ratio(generated, len(steps)),
        acceptance_by_position=acceptance_by_position(steps),
        prefill_s=prefill_s,
        draft_s=sum(s.draft_s for s in steps),
        verify_s=sum(s.verify_s for s in steps),
        total_s=total_s,
        tokens_per_s=_ratio(generated, total_s),
        accepted_by_stage=accepted_by_stage(steps),
    )


def accepted_by_stage(steps: Iterable[StepRecord]) -> dict[str, int]:
    """Accepted drafts summed by the stage that drafted them (stages that drafted some)."""
    counts: dict[str, int] = {}
    for step in steps:
        if step.stage is not None and step.proposed:
            counts[step.stage] = counts.get(step.stage, 0) + step.accepted
    return counts


def pool(stats: Iterable[RequestStats]) -> dict[str, float | None]:
    """Pool requests by summing counts and times (not by averaging per-request ratios)."""
    items = list(stats)
    generated = sum(s.generated_tokens for s in items)
    checks = sum(s.checks for s in items)
    drafted = sum(s.draft_tokens for s in items)
    accepted = sum(s.accepted_tokens for s in items)
    total = sum(s.total_s for s in items)
    return {
        "requests": len(items),
        "generated_tokens": generated,
        "checks": checks,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": _ratio(accepted, drafted),
        "mean_accepted_length": _ratio(generated, checks),
        "total_s": total,
        "tokens_per_s": _ratio(generated, total),
    }
