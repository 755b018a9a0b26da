"""One request's record: what it asked for, what came out, and the result built from them.

A :class:`serving.engine.decoder.Decoding` fills a :class:`Request` in as it steps: the
output cut at EOS and the budget (:meth:`Request.emit`), each step's counts and, in detailed
mode, the drafted tokens the target ruled on and the disagreements. :meth:`Request.result`
turns it into the :class:`GenerationResult` callers get.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from serving.engine.detailed import DetailedRecord, Disagreement, Rejection
from serving.engine.features import DraftedToken
from serving.engine.metrics import RequestStats, StepRecord, summarize
from serving.engine.sampling import SamplingParams
from serving.engine.step import StepResult

CONTEXT_WINDOW = 32  # tokens of context kept with each disagreement


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    from_draft: bool  # True: a draft token the target accepted; False: the target's own
    step: int  # index of the verification step that produced it
    verified: bool = True  # False: a draft kept although the target disagreed (relaxed)


@dataclass
class GenerationResult:
    token_ids: list[int]
    from_draft: list[bool]
    stats: RequestStats
    stop_reason: str  # "eos", "length", or "cancelled" (closed early)
    record: DetailedRecord | None = None
    steps: list[StepRecord] = field(default_factory=list)  # one per target pass, in order
    # Output positions kept although the target disagreed (relaxed mode only).
    unverified: list[int] = field(default_factory=list)


@dataclass
class Request:
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    detailed: bool
    request_id: str
    steps: list[StepRecord] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    from_draft: list[bool] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    drafted: list[DraftedToken] = field(default_factory=list)
    unverified: list[int] = field(default_factory=list)  # output positions

    def emit(
        self, new_tokens: list[int], accepted: int, eos_token_ids: Collection[int]
    ) -> list[tuple[int, bool]]:
        """Append the step's tokens to the output, cut at EOS and at the budget."""
        emitted: list[tuple[int, bool]] = []
        for i, token in enumerate(new_tokens):
            if len(self.output) >= self.max_new_tokens:
                break
            from_draft = i < accepted
            self.output.append(token)
            self.from_draft.append(from_draft)
            emitted.append((token, from_draft))
            if token in eos_token_ids:
                break
        return emitted

    def record_drafted(self, step: StepResult, index: int) -> None:
        """The step's drafted tokens the target ruled on: up to the first one not kept."""
        unverified = set(step.unverified)
        ruled = min(step.proposed, step.accepted + 1)
        for i, features in enumerate(step.features[:ruled]):
            self.drafted.append(
                DraftedToken(
                    **vars(features),
                    step=index,
                    token=int(step.drafts[i]),
                    accepted=i < step.accepted and i not in unverified,
                    kept=i < step.accepted,
                )
            )

    def record_rejection(self, tokens: list[int], rejection: Rejection) -> None:
        generated_before = len(tokens) - len(self.prompt)
        prefix = tokens + self.output[generated_before : generated_before + rejection.draft_index]
        self.disagreements.append(
            Disagreement.of(
                rejection,
                position=generated_before + rejection.draft_index,
                context=prefix[-CONTEXT_WINDOW:],
            )
        )

    def result(
        self,
        stop_reason: str,
        *,
        prefill_s: float,
        started: float,
        describe: Callable[[], dict[str, object]],
    ) -> GenerationResult:
        """The result so far; ``describe``: the decoder's description, for the detailed
        record."""
        stats = summarize(
            self.steps,
            prompt_tokens=len(self.prompt),
            prefill_s=prefill_s,
            total_s=time.perf_counter() - started,
        )
        return GenerationResult(
            token_ids=list(self.output),
            from_draft=list(self.from_draft),
            stats=stats,
            stop_reason=stop_reason,
            record=self._record(stats, describe()) if self.detailed else None,
            steps=list(self.steps),
            unverified=list(self.unverified),
        )

    def _record(self, stats: RequestStats, described: dict[str, object]) -> DetailedRecord:
        return DetailedRecord(
            request_id=self.request_id,
            drafter=described["drafter"],  # type: ignore[arg-type]
            policy=described["policy"],  # type: ignore[arg-type]
            sampling={
                "temperature": self.sampling.temperature,
                "top_k": self.sampling.top_k,
                "top_p": self.sampling.top_p,
                "seed": self.sampling.seed,
            },
            prompt_token_ids=list(self.prompt),
            output_token_ids=list(self.output),
            from_draft=list(self.from_draft),
            acceptance_rate=stats.acceptance_rate,
            mean_accepted_length=stats.mean_accepted_length,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            checks=stats.checks,
            steps=[[step.proposed, step.accepted] for step in self.steps],
            disagreements=list(self.disagreements),
            drafted=list(self.drafted),
            unverified=list(self.unverified),
        )
