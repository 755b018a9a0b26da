"""Evaluate draft packages against each other on held-out prompts, on one hardware target.

In one run, interleaved: plain decoding (no draft, the reference) and every contender
(champion, challenger, ...), each once per prompt in an order that rotates per prompt,
after one warm-up generation each, so machine noise lands on all alike. Greedy decoding:
every contender's output must equal the reference token for token (``lossless``).
Reported per contender, pooled over prompts as :mod:`serving.engine.metrics` defines them:
acceptance rate, mean accepted length, acceptance by position, tokens/s and its ratio to
plain decoding (``speedup``), and the same by workload and by source: ``builtin`` prompts
of the packaged workloads (held-out split) and ``traffic`` prompts replayed from held-out
collected or captured traffic (:class:`EncodedPrompt`, already tokenized by the target that
served them), so the gates can see both the traffic that drifted and what the draft must
not forget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.engine.build import build_decoder
from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import Drafter
from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.package import read_manifest
from serving.engine.drafters.plan import CascadePlan, Plan
from serving.engine.metrics import StepRecord, acceptance_by_position, pool
from serving.engine.request import GenerationResult
from serving.errors import BadInputError
from serving.loader import encode_messages
from serving.records.schema import RequestRecord
from serving.target import LoadedTarget
from tasks.data.prompts import Prompt
from tasks.evaluate.evaluated_curve import rounds_curve
from tasks.evaluate.interleave import Timed
from tasks.evaluate.priced import prefill_steps
from tasks.evaluate.report import (
    REFERENCE,
    TRAFFIC_PREFIX,
    ContenderResult,
    EvaluationReport,
    Group,
    source_of,
)
from tasks.evaluate.rounds import Generation, gather, time_rounds, timed_steps

WALL_CLOCK_ROUNDS = 2  # timed rounds over the prompts (the gates' interval reads them all)
PROFILE_TOKENS = 48  # tokens a drafting-cost profile's generation makes (tasks/evaluate/costs.py)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt replayed from a collected record: its chat-templated token ids as served."""

    id: str
    workload: str  # traffic:<the record's workload>
    token_ids: list[int]


def traffic_prompts(
    records: Sequence[RequestRecord], *, per_workload: int | None = None
) -> list[EncodedPrompt]:
    """Evaluation prompts from held-out traffic records (validated; see
    :func:`tasks.data.dataset.holdout_by_time`): at most ``per_workload`` of each recorded
    workload, the newest first, in a stable order (a repeated prompt is evaluated once)."""
    if per_workload is not None and per_workload < 1:
        raise BadInputError(f"per_workload must be >= 1, got {per_workload!r}")
    newest = sorted(records, key=lambda r: (r.timestamp, r.id), reverse=True)
    picked: list[EncodedPrompt] = []
    seen: set[tuple[int, ...]] = set()
    taken: dict[str, int] = {}
    for record in newest:
        workload, ids = record.workload, tuple(record.prompt_token_ids)
        if not ids or ids in seen or taken.get(workload, 0) == (per_workload or len(records)):
            continue
        seen.add(ids)
        taken[workload] = taken.get(workload, 0) + 1
        picked.append(EncodedPrompt(record.id, f"{TRAFFIC_PREFIX}{workload}", list(ids)))
    return sorted(picked, key=lambda p: (p.workload, p.id))


@dataclass(frozen=True)
class Contender:
    """A draft the evaluation times: its name, its draft package, and the plan the
    package holds (read when the contender is named, so a bad package is refused before
    any weights load)."""

    name: str  # "champion", "challenger", ...
    package: Path  # a draft package folder
    # An acceptance predictor folder: the package's drafter then runs as a one-stage
    # cascade driven by it (serving/engine/cascade) instead of under the package's own policy.
    predictor: Path | None = None
    plan: Plan = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        plan = read_manifest(self.package).plan(self.package)
        if self.predictor is not None and plan.drafts:
            object.__setattr__(self, "plan", CascadePlan((plan.drafter,), plan.k, self.predictor))
        else:
            object.__setattr__(self, "plan", plan)


@dataclass
class _Run:
    name: str
    decoder: SpeculativeDecoder
    k: int = 0  # the package's k (drafts a step at most)


def _decoders(contenders: Sequence[Contender], target: LoadedTarget) -> list[_Run]:
    names = [c.name for c in contenders]
    if REFERENCE in names or len(set(names)) != len(names):
        raise BadInputError(f"contender names must be unique and not {REFERENCE!r}: {names}")
    runs = [_Run(REFERENCE, build_decoder(target))]
    for contender in contenders:
        plan = contender.plan
        if isinstance(plan, CascadePlan):  # the package's drafter under its predictor
            drafter = build_drafter(plan.stages[0], target)
            assert drafter is not None  # a plan that drafts
            predicted = _predicted(drafter, contender, plan.k, target)
            decoder = build_decoder(target, plan, drafter=predicted)
        else:
            decoder = build_decoder(target, plan)
        runs.append(_Run(contender.name, decoder, plan.k))
    return runs


def contender_decoders(
    contenders: Sequence[Contender], target: LoadedTarget
) -> dict[str, tuple[SpeculativeDecoder, int]]:
    """Each contender's decoder, as the evaluation builds it, with its package's k."""
    return {
        run.name: (run.decoder, run.k)
        for run in _decoders(contenders, target)
        if run.name != REFERENCE
    }


def _predicted(drafter: Drafter, contender: Contender, k: int, target: LoadedTarget) -> Drafter:
    """The package's drafter (already loaded) as the single stage of a cascade driven by
    the contender's predictor (refused, naming it, when the predictor never saw that kind
    of drafter)."""
    from serving.engine.cascade.drafter import CascadeDrafter, Stage
    from serving.engine.drafters.kinds import stage_of
    from serving.engine.predictor import PredictorError, load_predictor

    assert contender.predictor is not None
    predictor = load_predictor(contender.predictor, hardware=target.hardware)
    kind = stage_of(drafter.kind)
    if kind not in predictor.stages:
        raise PredictorError(
            f"contender {contender.name!r}: its predictor was trained on stages "
            f"{list(predictor.stages)}, not on {kind!r} drafts"
        )
    return CascadeDrafter(
        [Stage(str(drafter.name), kind, drafter)],
        k_max=k,
        verify_curve=target.hardware.curve,
        predictor=predictor,
    )


def _encoded(prompt: Prompt | EncodedPrompt, target: LoadedTarget) -> list[int]:
    """The prompt's token ids: a replayed prompt's as served, a built-in one's chat
    templated by the target's tokenizer."""
    if isinstance(prompt, EncodedPrompt):
        return prompt.token_ids
    if target.tokenizer is None:
        raise BadInputError(f"prompt {prompt.id!r} needs the target's tokenizer, and it has none")
    return encode_messages(target.tokenizer, prompt.messages)


def _summary(rows: Sequence[Generation], reference_tps: float | None) -> ContenderResult:
    pooled = pool(row.stats for row in rows)
    seconds = sum(row.seconds for row in rows)
    tokens = sum(len(row.token_ids) for row in rows)
    steps = [StepRecord(p, a, 0, 0.0, 0.0) for row in rows for p, a in row.steps]
    tps = tokens / seconds if seconds else None
    return ContenderResult.model_validate(
        {
            **pooled,
            "tokens_per_s": tps,
            "speedup": tps / reference_tps if tps and reference_tps else None,
            "acceptance_by_position": acceptance_by_position(steps),
            "lossless": all(row.lossless for row in rows),
            "mismatched_prompts": [row.prompt_id for row in rows if not row.lossless],
        }
    )


def _grouped(
    rows: Mapping[str, Sequence[Generation]],
    prompts: Sequence[Prompt | EncodedPrompt],
    key: Callable[[str], str],
) -> dict[str, Group]:
    """Every contender's numbers over the prompts of each ``key(workload)``."""
    groups: dict[str, Group] = {}
    for value in sorted({key(p.workload) for p in prompts}):
        subset = {n: [r for r in rs if key(r.workload) == value] for n, rs in rows.items()}
        base = _summary(subset[REFERENCE], None).tokens_per_s
        groups[value] = {n: _summary(rs, base) for n, rs in subset.items()}
    return groups


def _check_evaluation(
    contenders: Sequence[Contender], prompts: Sequence[Prompt | EncodedPrompt], rounds: int
) -> None:
    if not prompts:
        raise BadInputError("no evaluation prompts: the held-out split is empty")
    if not contenders:
        raise BadInputError("nothing to evaluate: give at least one contender")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BadInputError(f"rounds must be an integer >= 1, got {rounds!r}")


def _encode_all(prompts: Sequence[Prompt | EncodedPrompt], target: LoadedTarget) -> list[list[int]]:
    """Every prompt's token ids (:func:`_encoded`), none of them empty."""
    encoded = [_encoded(p, target) for p in prompts]
    if any(not ids for ids in encoded):
        empty = [p.id for p, ids in zip(prompts, encoded, strict=True) if not ids]
        raise BadInputError(f"evaluation prompts without tokens: {empty[:3]}")
    return encoded


def evaluate_report(
    contenders: Sequence[Contender],
    prompts: Sequence[Prompt | EncodedPrompt],
    *,
    target: LoadedTarget,
    max_new_tokens: int = 64,
    rounds: int = WALL_CLOCK_ROUNDS,
    pregate_margin: float | None = None,
    champion: str = "champion",
    stop_confidence: float = 0.0,
    progress: bool = True,
) -> EvaluationReport:
    """Run the interleaved evaluation (see the module docstring) on ``target``, on its
    hardware target (its verify curve prices the policies): every contender's drafting
    cost profiled first (:mod:`tasks.evaluate.costs`), then ``rounds`` timed
    rounds over the prompts.

    With a ``pregate_margin``, every contender's modelled speedup is predicted first
    (:mod:`tasks.evaluate.pregate`), and a contender other than ``champion`` predicted
    below the champion's (plain decoding's, without one) by more than the margin is not
    timed: the report names it in ``untimed`` with the reason.

    With a ``stop_confidence`` (and more than one round), a challenger whose wall-clock
    interval at that confidence after the first round (its per-prompt speed over the
    champion's, over plain decoding's without one) lies wholly below 1.0 runs no more
    rounds: the gates' clock check could no longer pass it. The report names it in
    ``stopped_early`` with the interval."""
    _check_evaluation(contenders, prompts, rounds)
    runs = _decoders(contenders, target)
    encoded = _encode_all(prompts, target)
    curve = list(target.hardware.curve)
    clock = [time.perf_counter()]
    phase_s: dict[str, float] = {}

    def lap(phase: str) -> None:
        clock.append(time.perf_counter())
        phase_s[phase] = round(clock[-1] - clock[-2], 3)

    costs = _profile_costs(runs, encoded, curve, max_new_tokens, progress)
    lap("profile")
    predicted: dict[str, float | None] = {}
    untimed: dict[str, str] = {}
    recording: list[Timed[GenerationResult]] = []
    if pregate_margin is not None:
        recording = _record_plain(runs[0].decoder, encoded, max_new_tokens)
        predicted, untimed = _pregate(
            runs,
            encoded,
            recording,
            target=target,
            curve=curve,
            costs=costs,
            margin=pregate_margin,
            champion=champion,
        )
        runs = [run for run in runs if run.name not in untimed]
        lap("pregate")
    # With a champion timed beside the challengers, the wall clock compares them with it, and
    # plain decoding's one timed pass (the pre-gate's recording) serves the measured
    # speedups: it is not timed again in the rounds.
    plain_once = bool(recording) and champion in {run.name for run in runs}
    timings, stopped = time_rounds(
        {run.name: run.decoder for run in runs if not (plain_once and run.name == REFERENCE)},
        encoded,
        rounds=rounds,
        max_new_tokens=max_new_tokens,
        champion=champion,
        stop_confidence=stop_confidence,
        desc=f"evaluating on {target.name} ({rounds} rounds)",
        progress=progress,
    )
    names = [run.name for run in runs]
    rows = gather(names, prompts, timings, rounds=rounds, plain=recording if plain_once else ())
    lap("timed")
    # The curve the timed rounds' passes followed (plain decoding's recording, timed before
    # them, only where they verified too few one-token blocks).
    recorded = [step for run in recording for step in run.value.steps]
    evaluated, passes = rounds_curve(timed_steps(timings), recorded, curve)
    reference_tps = _summary(rows[REFERENCE], None).tokens_per_s
    return EvaluationReport(
        hardware=target.name,
        prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        rounds=rounds,
        verify_curve=curve,
        draft_costs=costs,
        evaluated_curve=evaluated,
        evaluated_passes=passes,
        predicted_speedups=predicted,
        untimed=untimed,
        stopped_early=stopped,
        phase_s=phase_s,
        contenders={c.name: str(c.package) for c in contenders if c.name not in untimed},
        results={name: _summary(name_rows, reference_tps) for name, name_rows in rows.items()},
        by_workload=_grouped(rows, prompts, lambda workload: workload),
        by_source=_grouped(rows, prompts, source_of),
        per_prompt={name: [row.run() for row in name_rows] for name, name_rows in rows.items()},
    )


def _profile_costs(
    runs: Sequence[_Run],
    encoded: Sequence[list[int]],
    curve: Sequence[float],
    max_new_tokens: int,
    progress: bool,
) -> dict[str, float]:
    """Each drafting contender's cost per drafted token (:mod:`tasks.evaluate.costs`); its
    cost-aware policy then prices drafting at that cost, so that its steps, and the
    modelled speed priced from them, do not depend on the clock."""
    from tasks.evaluate.costs import fix_draft_cost, profile_draft_cost

    costs: dict[str, float] = {}
    for run in runs:
        if run.decoder.drafter is None:
            continue
        cost, steps = profile_draft_cost(
            run.decoder,
            encoded,
            curve=curve,
            k=max(run.k, 1),
            max_new_tokens=min(PROFILE_TOKENS, max_new_tokens),
        )
        if cost is None:
            log.info("%s drafted nothing to profile with k=%d", run.name, run.k)
            continue
        costs[run.name] = round(cost, 6)
        fix_draft_cost(run.decoder, cost)
        if progress:
            log.info(
                "%s drafts at %.4f one-token passes a token (median of %d steps)",
                run.name,
                cost,
                steps,
            )
    return costs


def _record_plain(
    plain: SpeculativeDecoder, encoded: Sequence[list[int]], max_new_tokens: int
) -> list[Timed[GenerationResult]]:
    """Plain decoding of every prompt, once, timed (after a warm-up): the pre-gate's
    recording of the target's output, and plain decoding's timing where the rounds do not
    time it again."""
    plain.generate(encoded[0], max_new_tokens=min(8, max_new_tokens))
    recording: list[Timed[GenerationResult]] = []
    for ids in encoded:
        started = time.perf_counter()
        result = plain.generate(list(ids), max_new_tokens=max_new_tokens)
        recording.append(Timed(result, time.perf_counter() - started))
    return recording


def _pregate(
    runs: Sequence[_Run],
    encoded: Sequence[list[int]],
    recording: Sequence[Timed[GenerationResult]],
    *,
    target: LoadedTarget,
    curve: Sequence[float],
    costs: dict[str, float],
    margin: float,
    champion: str,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """Every contender's predicted modelled speedup on plain decoding's ``recording`` (its
    outputs and prefill times), and the challengers not to time with the reason (see
    :func:`evaluate_report`)."""
    from tasks.evaluate.pregate import predict

    if not 0 <= margin < 1:
        raise BadInputError(f"pregate_margin must be in [0, 1), got {margin!r}")
    predictions = predict(
        {run.name: run.decoder for run in runs if run.name != REFERENCE},
        encoded,
        [r.value.token_ids for r in recording],
        target=target,
        curve=curve,
        draft_costs=costs,
        prefills=[
            prefill_steps(r.value.stats.prefill_s, r.value.stats.total_s, len(r.value.steps))
            for r in recording
        ],
    )
    speedups = {name: p.speedup for name, p in predictions.items()}
    has_champion = champion in predictions
    baseline = speedups[champion] if has_champion else 1.0
    over = "the champion's" if has_champion else "plain decoding's"
    untimed: dict[str, str] = {}
    for name, speedup in speedups.items():
        if name == champion or speedup is None or baseline is None:
            continue
        if speedup < baseline * (1.0 - margin):
            untimed[name] = (
                f"predicted modelled speedup {speedup:.3f}, more than {margin:.0%} "
                f"below {over} {baseline:.3f}: not timed"
            )
            log.info("%s: %s", name, untimed[name])
    return speedups, untimed


def evaluate(
    contenders: Sequence[Contender],
    prompts: Sequence[Prompt | EncodedPrompt],
    *,
    target: LoadedTarget,
    max_new_tokens: int = 64,
    rounds: int = WALL_CLOCK_ROUNDS,
    stop_confidence: float = 0.0,
    progress: bool = True,
) -> dict[str, Any]:
    """:func:`evaluate_report` as the JSON that commands and studies write."""
    report = evaluate_report(
        contenders,
        prompts,
        target=target,
        max_new_tokens=max_new_tokens,
        rounds=rounds,
        stop_confidence=stop_confidence,
        progress=progress,
    )
    return report.model_dump(mode="json")
