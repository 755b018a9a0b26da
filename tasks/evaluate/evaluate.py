"""Evaluate draft packages against each other on held-out prompts, on one hardware target.

In one run, interleaved: plain decoding (no draft, the reference) and every contender
(champion, challenger, ...), each once per prompt in an order that rotates per prompt,
after one warm-up generation each, so machine noise lands on all alike. Greedy decoding:
every contender's output must equal the reference token for token (``lossless``).
Reported per contender, pooled over prompts as :mod:`serving.metrics` defines them:
acceptance rate, mean accepted length, acceptance by position, tokens/s and its ratio to
plain decoding (``speedup``), and the same by workload and by source: ``builtin`` prompts
of the packaged workloads (held-out split) and ``traffic`` prompts replayed from held-out
collected or captured traffic (:class:`EncodedPrompt`, already tokenized by the target that
served them), so the gates can see both the traffic that drifted and what the draft must
not forget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.drafters.package import load_package
from serving.engine import SpeculativeDecoder
from serving.errors import BadInputError
from serving.hardware import engine_target
from serving.loader import encode_messages, eos_ids
from serving.metrics import RequestStats, StepRecord, acceptance_by_position, pool
from serving.policy import DraftLengthPolicy, make_policy
from serving.records.schema import RequestRecord
from tasks.data.prompts import Prompt
from tasks.evaluate.interleave import interleave
from tasks.evaluate.report import ContenderResult, EvaluationReport, Group, PromptRun

REFERENCE = "plain"


TRAFFIC = "traffic"  # prompts replayed from held-out collected traffic
BUILTIN = "builtin"  # prompts of the packaged workloads' held-out split
TRAFFIC_PREFIX = f"{TRAFFIC}:"  # their workload in reports: traffic:<recorded workload>


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


def source_of(workload: str) -> str:
    return TRAFFIC if workload.startswith(TRAFFIC_PREFIX) else BUILTIN


@dataclass(frozen=True)
class Contender:
    name: str  # "champion", "challenger", ...
    package: Path  # a draft package folder
    # An acceptance predictor folder: the package's drafter then runs as a one-stage
    # cascade driven by it (serving/cascade) instead of under the package's own policy.
    predictor: Path | None = None


@dataclass
class _Run:
    name: str
    decoder: SpeculativeDecoder


def _decoders(contenders, target, tokenizer, hardware: str) -> list[_Run]:
    names = [c.name for c in contenders]
    if REFERENCE in names or len(set(names)) != len(names):
        raise BadInputError(f"contender names must be unique and not {REFERENCE!r}: {names}")
    curve = engine_target(hardware).curve
    eos = eos_ids(target, tokenizer)
    runs = [_Run(REFERENCE, SpeculativeDecoder(target, eos_token_ids=eos))]
    for contender in contenders:
        manifest, drafter = load_package(contender.package, target, tokenizer)
        policy: DraftLengthPolicy | None = None
        if drafter is not None and contender.predictor is not None:
            drafter, policy = _predicted(drafter, contender, manifest.k, curve, hardware)
        elif drafter is not None:
            policy = make_policy(manifest.policy, manifest.k, verify_curve=curve)
        runs.append(
            _Run(
                contender.name,
                SpeculativeDecoder(target, drafter=drafter, policy=policy, eos_token_ids=eos),
            )
        )
    return runs


def _predicted(drafter, contender: Contender, k: int, curve, hardware: str):
    """The package's drafter as the single stage of a cascade driven by the contender's
    predictor (refused, naming it, when the predictor never saw that kind of drafter)."""
    from serving.cascade.drafter import CascadeDrafter, CascadePolicy, Stage
    from serving.drafters.kinds import stage_of
    from serving.predictor import PredictorError, load_predictor

    assert contender.predictor is not None
    predictor = load_predictor(contender.predictor, hardware=hardware)
    kind = stage_of(drafter.kind)
    if kind not in predictor.stages:
        raise PredictorError(
            f"contender {contender.name!r}: its predictor was trained on stages "
            f"{list(predictor.stages)}, not on {kind!r} drafts"
        )
    cascade = CascadeDrafter(
        [Stage(str(drafter.name), kind, drafter)],
        k_max=k,
        verify_curve=curve,
        predictor=predictor,
    )
    return cascade, CascadePolicy(cascade)


@dataclass(frozen=True)
class _Generation:
    """One contender's generation of one prompt."""

    prompt_id: str
    workload: str
    seconds: float
    token_ids: list[int]
    stats: RequestStats
    steps: list[list[int]]  # [proposed, accepted] per check
    lossless: bool = False  # set once plain decoding's output is known

    def run(self) -> PromptRun:
        return PromptRun(
            prompt_id=self.prompt_id,
            workload=self.workload,
            seconds=self.seconds,
            stats=self.stats.to_dict(),
            steps=self.steps,
            lossless=self.lossless,
        )


def _summary(rows: Sequence[_Generation], reference_tps: float | None) -> ContenderResult:
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


def evaluate_report(
    contenders: Sequence[Contender],
    prompts: Sequence[Prompt | EncodedPrompt],
    *,
    target,
    tokenizer,
    hardware: str,
    max_new_tokens: int = 64,
    progress: bool = True,
) -> EvaluationReport:
    """Run the interleaved evaluation (see the module docstring)."""
    from tqdm.auto import tqdm

    if not prompts:
        raise BadInputError("no evaluation prompts: the held-out split is empty")
    if not contenders:
        raise BadInputError("nothing to evaluate: give at least one contender")
    runs = _decoders(contenders, target, tokenizer, hardware)
    encoded = [
        p.token_ids if isinstance(p, EncodedPrompt) else encode_messages(tokenizer, p.messages)
        for p in prompts
    ]
    if any(not ids for ids in encoded):
        empty = [p.id for p, ids in zip(prompts, encoded, strict=True) if not ids]
        raise BadInputError(f"evaluation prompts without tokens: {empty[:3]}")
    rows: dict[str, list[_Generation]] = {run.name: [] for run in runs}
    bar = tqdm(
        total=len(prompts) * len(runs), desc=f"evaluating on {hardware}", disable=not progress
    )
    decoders = {run.name: run.decoder for run in runs}
    calls = {
        name: (lambda index, d=decoder: d.generate(encoded[index], max_new_tokens=max_new_tokens))
        for name, decoder in decoders.items()
    }
    rounds = interleave(
        calls,
        len(prompts),
        # warm-up: first-call costs (kernels, allocations) stay out of timings
        warm_up=lambda name: decoders[name].generate(
            encoded[0], max_new_tokens=min(8, max_new_tokens)
        ),
        on_end=lambda *_: bar.update(),
    )
    for prompt, timed in zip(prompts, rounds, strict=True):
        reference = timed[REFERENCE].value.token_ids
        for name, run in timed.items():
            rows[name].append(
                _Generation(
                    prompt_id=prompt.id,
                    workload=prompt.workload,
                    seconds=run.seconds,
                    token_ids=run.value.token_ids,
                    stats=run.value.stats,
                    steps=[[s.proposed, s.accepted] for s in run.value.steps],
                    lossless=run.value.token_ids == reference,
                )
            )
    bar.close()
    reference_tps = _summary(rows[REFERENCE], None).tokens_per_s

    def grouped(key: Callable[[str], str]) -> dict[str, Group]:
        """Every contender's numbers over the prompts of each ``key(workload)``."""
        groups: dict[str, Group] = {}
        for value in sorted({key(p.workload) for p in prompts}):
            subset = {n: [r for r in rs if key(r.workload) == value] for n, rs in rows.items()}
            base = _summary(subset[REFERENCE], None).tokens_per_s
            groups[value] = {n: _summary(rs, base) for n, rs in subset.items()}
        return groups

    return EvaluationReport(
        hardware=hardware,
        prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        contenders={c.name: str(c.package) for c in contenders},
        results={name: _summary(name_rows, reference_tps) for name, name_rows in rows.items()},
        by_workload=grouped(lambda workload: workload),
        by_source=grouped(source_of),
        per_prompt={name: [row.run() for row in name_rows] for name, name_rows in rows.items()},
    )


def evaluate(
    contenders: Sequence[Contender],
    prompts: Sequence[Prompt | EncodedPrompt],
    *,
    target,
    tokenizer,
    hardware: str,
    max_new_tokens: int = 64,
    progress: bool = True,
) -> dict[str, Any]:
    """:func:`evaluate_report` as the JSON that commands and studies write."""
    report = evaluate_report(
        contenders,
        prompts,
        target=target,
        tokenizer=tokenizer,
        hardware=hardware,
        max_new_tokens=max_new_tokens,
        progress=progress,
    )
    return report.model_dump(mode="json")
