"""Speed priced by a fixed cost profile instead of the clock.

A measured speedup is tokens/s over plain decoding's, timed interleaved on the machine that
ran the evaluation: the truth there, but it moves with the machine's load. Priced, each
contender's recorded checks are charged what a fixed profile says they cost: a target pass
over ``n`` tokens (the last token and ``n - 1`` drafts) costs ``curve(n)`` one-token passes
(a measured verify curve, :func:`serving.engine.policy.curve_cost`), and each drafted token
``draft_cost`` of them. Plain decoding is priced the same way (one token per one-token
pass), so a priced speedup depends only on what was accepted: the same evaluation gives
the same decision on any machine (the gates' ``speed_profile``, :mod:`tasks.evaluate.gates`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from serving.curves import curve_cost, normalise_curve
from serving.errors import BadInputError
from tasks.evaluate.report import REFERENCE, EvaluationReport, Group, PromptRun, source_of

PromptKey = tuple[str, str]  # (workload, prompt id)


class Pricing:
    """The cost, in one-token target passes, of what a generation did: a check over ``n``
    tokens costs ``curve(n)``, each drafted token ``draft_cost`` — or, for a contender
    named in ``draft_costs``, its own profiled cost (the modelled speed,
    :mod:`tasks.evaluate.modelled`) — and, where ``prefills`` prices it, the prompt's
    prefill (the same for every contender of that prompt)."""

    def __init__(
        self,
        verify_curve: Sequence[float],
        draft_cost: float,
        draft_costs: Mapping[str, float] | None = None,
        prefills: Mapping[PromptKey, float] | None = None,
    ) -> None:
        for name, cost in {"draft_cost": draft_cost, **(draft_costs or {})}.items():
            if cost < 0:
                raise BadInputError(f"draft cost of {name!r} must be >= 0, got {cost!r}")
        for key, cost in (prefills or {}).items():
            if cost < 0:
                raise BadInputError(f"prefill cost of prompt {key!r} must be >= 0, got {cost!r}")
        self.curve = normalise_curve(tuple(verify_curve))
        self.draft_cost = draft_cost
        self.draft_costs = dict(draft_costs or {})
        self.prefills = dict(prefills or {})

    def prefill(self, run: PromptRun) -> float:
        """What ``run``'s prefill costs (0 where prefills are not priced)."""
        return self.prefills.get((run.workload, run.prompt_id), 0.0)

    def checks(self, blocks: Mapping[int, int], contender: str | None = None) -> float:
        """``blocks``: drafts proposed in a check -> how many checks proposed that many."""
        per_draft = self.draft_costs.get(contender or "", self.draft_cost)
        return sum(
            count * (curve_cost(self.curve, drafts + 1) + per_draft * drafts)
            for drafts, count in blocks.items()
        )


def _speedups(
    rows: Mapping[str, Sequence[PromptRun]], pricing: Pricing, keep: Callable[[str], bool]
) -> dict[str, float | None]:
    """Each contender's priced speed over plain decoding's, on the prompts ``keep`` takes."""
    speed: dict[str, float | None] = {}
    for name, runs in rows.items():
        tokens = cost = 0.0
        for run in runs:
            if keep(run.workload):
                tokens += run.stats["generated_tokens"]
                blocks: dict[int, int] = {}
                for proposed, _ in run.steps:
                    blocks[proposed] = blocks.get(proposed, 0) + 1
                cost += pricing.checks(blocks, name) + pricing.prefill(run)
        speed[name] = tokens / cost if cost else None
    plain = speed[REFERENCE]
    return {n: s / plain if s and plain else None for n, s in speed.items()}


def prefill_costs(plain: Sequence[PromptRun]) -> dict[PromptKey, float]:
    """Each prompt's prefill in plain decoding's steps, from plain decoding's own run of it:
    its prefill's seconds over its seconds per check after the prefill (both from the same
    generation, so a load that slows the machine evenly cancels). A run without these
    numbers (an older report, a generation that never checked) is left out: unpriced."""
    costs: dict[PromptKey, float] = {}
    for run in plain:
        cost = prefill_steps(run.stats.get("prefill_s"), run.stats.get("total_s"), len(run.steps))
        if cost is not None:
            costs[(run.workload, run.prompt_id)] = cost
    return costs


def prefill_steps(prefill_s: float | None, total_s: float | None, checks: int) -> float | None:
    """A plain generation's prefill in its own steps: ``prefill_s`` over the seconds per
    check after it; None where that cannot be told."""
    if prefill_s is None or total_s is None or checks == 0 or total_s <= prefill_s:
        return None
    return float(prefill_s) / ((float(total_s) - float(prefill_s)) / checks)


def _workload_is(workload: str) -> Callable[[str], bool]:
    return lambda seen: seen == workload


def _source_is(source: str) -> Callable[[str], bool]:
    return lambda seen: source_of(seen) == source


def _priced(group: Group, speedups: Mapping[str, float | None]) -> Group:
    return {n: r.model_copy(update={"speedup": speedups[n]}) for n, r in group.items()}


def priced_report(report: EvaluationReport, pricing: Pricing) -> EvaluationReport:
    """``report`` with every speedup (overall, per workload, per source) priced from its
    per-prompt checks; the measured tokens/s stay as they were."""
    rows = report.per_prompt
    if rows is None or REFERENCE not in rows:
        raise BadInputError(
            "the gates price each contender's checks, and this evaluation report has no "
            "per-prompt rows: evaluate again (evaluate() keeps them)"
        )
    return report.model_copy(
        update={
            "results": _priced(report.results, _speedups(rows, pricing, lambda w: True)),
            "by_workload": {
                workload: _priced(group, _speedups(rows, pricing, _workload_is(workload)))
                for workload, group in report.by_workload.items()
            },
            "by_source": {
                source: _priced(group, _speedups(rows, pricing, _source_is(source)))
                for source, group in report.by_source.items()
            },
        }
    )


def _backend_cost(row: Mapping[str, Any], pricing: Pricing) -> tuple[float, float]:
    """Tokens and priced cost of one backend generation (:mod:`serving.backends.run`):
    checks by drafts proposed, from the checks that reached each draft position."""
    tokens = float(row["tokens"])
    checks = int(row.get("checks") or 0)
    if checks == 0:  # a backend that counts no checks (plain decoding): a pass per token
        return tokens, tokens
    reached = [int(r) for r in row.get("reached_by_position") or ()]
    blocks = {0: checks - (reached[0] if reached else 0)}
    for drafts, count in enumerate(reached, start=1):
        blocks[drafts] = count - (reached[drafts] if drafts < len(reached) else 0)
    return tokens, pricing.checks(blocks)


def priced_backend_speedups(report: Mapping[str, Any], pricing: Pricing) -> dict[str, float | None]:
    """Each contender's priced speedup in a per-target report
    (:func:`tasks.evaluate.targets.evaluate_target`: every contender ran beside its own
    plain decoding, ``per_prompt["plain (<name>)"]``)."""
    rows = report["per_prompt"]
    speedups: dict[str, float | None] = {}
    for name in report["results"]:
        if name == REFERENCE:
            continue
        speeds = []
        for runs in (rows[name], rows[f"{REFERENCE} ({name})"]):
            costs = [_backend_cost(row, pricing) for row in runs]
            cost = sum(c for _, c in costs)
            speeds.append(sum(t for t, _ in costs) / cost if cost else None)
        mine, plain = speeds
        speedups[name] = mine / plain if mine and plain else None
    return speedups
