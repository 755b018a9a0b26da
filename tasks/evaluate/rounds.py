"""An evaluation's timed rounds: every decoder on every prompt, interleaved, one warm-up
each first, a challenger stopped after the first round when its wall-clock interval already
lies below the champion's, and each contender's generations gathered per prompt, checked
against plain decoding's output token for token."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.metrics import RequestStats, StepRecord
from serving.engine.request import GenerationResult
from tasks.evaluate.interleave import Timed, interleave
from tasks.evaluate.report import REFERENCE, PromptRun

log = logging.getLogger(__name__)

# Per prompt, per contender: its timed generations, one per round.
Timings = list[dict[str, list[Timed[GenerationResult]]]]


class PromptLike(Protocol):
    """What the rounds read of a prompt: its id and workload."""

    @property
    def id(self) -> str: ...

    @property
    def workload(self) -> str: ...


@dataclass(frozen=True)
class Generation:
    """One contender's generation of one prompt."""

    prompt_id: str
    workload: str
    seconds: float  # the mean over the rounds
    token_ids: list[int]
    stats: RequestStats
    steps: list[list[int]]  # [proposed, accepted] per check (the first round's)
    lossless: bool = False  # every round's output equals plain decoding's
    round_seconds: tuple[float, ...] = ()

    def run(self) -> PromptRun:
        return PromptRun(
            prompt_id=self.prompt_id,
            workload=self.workload,
            seconds=self.seconds,
            stats=self.stats.to_dict(),
            steps=self.steps,
            lossless=self.lossless,
            round_seconds=list(self.round_seconds),
        )


def time_rounds(
    decoders: Mapping[str, SpeculativeDecoder],
    encoded: Sequence[list[int]],
    *,
    rounds: int,
    max_new_tokens: int,
    champion: str,
    stop_confidence: float,
    desc: str,
    progress: bool,
) -> tuple[Timings, dict[str, str]]:
    """``rounds`` interleaved rounds of every decoder over the prompts ``encoded`` (after
    one warm-up each): the timings per prompt and decoder, and the challengers stopped after
    the first round with the reason (with a ``stop_confidence`` and more than one round)."""
    from tqdm.auto import tqdm

    count = len(encoded)
    bar = tqdm(total=rounds * count * len(decoders), desc=desc, disable=not progress)
    calls = {
        name: (
            lambda index, d=decoder: d.generate(
                encoded[index % count], max_new_tokens=max_new_tokens
            )
        )
        for name, decoder in decoders.items()
    }
    timings: Timings = [{name: [] for name in decoders} for _ in encoded]

    def run_rounds(names: Sequence[str], first: int, total: int) -> None:
        timed_rounds = interleave(
            {name: calls[name] for name in names},
            total,
            # warm-up: first-call costs (kernels, allocations) stay out of timings
            warm_up=None
            if first
            else lambda name: decoders[name].generate(
                encoded[0], max_new_tokens=min(8, max_new_tokens)
            ),
            on_end=lambda *_: bar.update(),
            first_round=first,
        )
        for index, timed in enumerate(timed_rounds, start=first):
            for name, run in timed.items():
                timings[index % count][name].append(run)

    stopped: dict[str, str] = {}
    if stop_confidence and rounds > 1:
        run_rounds(list(decoders), 0, count)  # the first round over every prompt
        stopped = stop_early(timings, champion, stop_confidence)
        bar.total -= len(stopped) * (rounds - 1) * count
        run_rounds([n for n in decoders if n not in stopped], count, (rounds - 1) * count)
    else:
        run_rounds(list(decoders), 0, rounds * count)
    bar.close()
    return timings, stopped


def stop_early(
    timings: Sequence[Mapping[str, Sequence[Timed[GenerationResult]]]],
    champion: str,
    confidence: float,
) -> dict[str, str]:
    """The challengers whose first round already puts their wall-clock interval wholly
    below the champion's speed (plain decoding's without one), with the reason."""
    from tasks.evaluate.interval import log_ratio_interval, speed_log_ratios

    names = list(timings[0])
    baseline = champion if champion in names else REFERENCE
    if baseline not in names:
        return {}

    def pairs(name: str) -> list[tuple[int, float]]:
        return [(by[name][0].value.stats.generated_tokens, by[name][0].seconds) for by in timings]

    stopped: dict[str, str] = {}
    for name in names:
        if name in (baseline, REFERENCE, champion):
            continue
        logs = speed_log_ratios(pairs(name), pairs(baseline))
        if not logs:
            continue
        interval = log_ratio_interval(logs, confidence)
        if interval.high < 1.0:
            stopped[name] = interval.describe(name, baseline) + " after one round: stopped"
            log.info("%s: %s", name, stopped[name])
    return stopped


def gather(
    names: Sequence[str],
    prompts: Sequence[PromptLike],
    timings: Timings,
    *,
    rounds: int,
    plain: Sequence[Timed[GenerationResult]] = (),
) -> dict[str, list[Generation]]:
    """Each contender's generation of each prompt (contenders in the order of ``names``),
    lossless where every round's output equals plain decoding's: ``plain``'s one recorded
    pass when given (plain decoding was not timed in the rounds), else its own rounds'."""
    rows: dict[str, list[Generation]] = {name: [] for name in names}
    for index, (prompt, timed) in enumerate(zip(prompts, timings, strict=True)):
        by_name: dict[str, list[Timed[GenerationResult]]] = timed
        if plain:
            by_name = {REFERENCE: [plain[index]], **timed}
            references = [plain[index].value.token_ids] * rounds
        else:
            references = [run.value.token_ids for run in timed[REFERENCE]]
        for name, runs_of in by_name.items():
            first = runs_of[0].value
            seconds = [run.seconds for run in runs_of]
            rows[name].append(
                Generation(
                    prompt_id=prompt.id,
                    workload=prompt.workload,
                    seconds=sum(seconds) / len(seconds),
                    token_ids=first.token_ids,
                    stats=first.stats,
                    steps=[[s.proposed, s.accepted] for s in first.steps],
                    lossless=all(
                        run.value.token_ids == reference
                        for run, reference in zip(runs_of, references, strict=False)
                    ),
                    round_seconds=tuple(seconds),
                )
            )
    return rows


def timed_steps(timings: Timings) -> list[StepRecord]:
    """Every step of every timed generation, over all prompts, contenders and rounds."""
    return [
        step
        for by_name in timings
        for runs_of in by_name.values()
        for run in runs_of
        for step in run.value.steps
    ]
