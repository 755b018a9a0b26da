"""The evaluation report, typed: what :func:`tasks.evaluate.evaluate.evaluate_report`
returns, the gates judge, the registry keeps with each evaluation run, and an evaluation
file carries back from another machine (:mod:`tasks.evaluate.evaluation_file`).

Strict (no coercion, no unknown keys, every number finite and >= 0): a report read from a
file is refused with the bad field named before anything reaches the registry.
``model_dump(mode="json")`` gives the JSON the commands write, keys in the order declared.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from registry.acceptance import TRAFFIC, TRAFFIC_PREFIX

REFERENCE = "plain"  # plain decoding, the contender every speedup is relative to
BUILTIN = "builtin"  # prompts of the packaged workloads' held-out split


def source_of(workload: str) -> str:
    return TRAFFIC if workload.startswith(TRAFFIC_PREFIX) else BUILTIN


Count = Annotated[int, Field(ge=0)]
Number = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_STRICT = ConfigDict(extra="forbid", strict=True)


class ContenderResult(BaseModel):
    """One contender's pooled numbers (:func:`serving.engine.metrics.pool`, plus speed and
    losslessness), overall or over one workload or source."""

    model_config = _STRICT

    requests: Count
    generated_tokens: Count
    checks: Count
    draft_tokens: Count
    accepted_tokens: Count
    acceptance_rate: Number | None
    mean_accepted_length: Number | None
    total_s: Number
    tokens_per_s: Number | None
    speedup: Number | None  # tokens_per_s over plain decoding's, in the same group
    acceptance_by_position: list[Number | None]
    lossless: bool
    mismatched_prompts: list[str]

    @model_validator(mode="after")
    def _lossless_agrees(self) -> ContenderResult:
        if self.lossless == bool(self.mismatched_prompts):
            raise ValueError(
                f"lossless is {self.lossless} but mismatched_prompts is {self.mismatched_prompts}"
            )
        return self


Group = dict[str, ContenderResult]  # contender name (plain included) -> its numbers


class PromptRun(BaseModel):
    """One contender's generation of one prompt (its output tokens left out)."""

    model_config = _STRICT

    prompt_id: str
    workload: str
    seconds: Number
    stats: dict[str, Any]  # serving.engine.metrics.RequestStats, as its to_dict gives it
    steps: list[list[int]]  # [proposed, accepted] per check
    lossless: bool
    # Each timed round's seconds (``seconds`` is their mean); empty in older reports.
    round_seconds: list[Number] = Field(default_factory=list)


class EvaluationReport(BaseModel):
    """One interleaved evaluation of plain decoding and every contender on one target."""

    model_config = _STRICT

    hardware: str
    prompts: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    contenders: dict[str, str]  # name -> the package folder it was loaded from, there
    results: Group
    by_workload: dict[str, Group]
    by_source: dict[str, Group] = Field(default_factory=dict)
    per_prompt: dict[str, list[PromptRun]] | None = None  # contender -> its prompts, in order
    rounds: int = Field(1, ge=1)  # timed rounds over the prompts
    # What the modelled speed prices with (tasks/evaluate/modelled.py): the target's verify
    # curve when it ran, and each drafting contender's profiled cost per drafted token in
    # one-token target passes (tasks/evaluate/costs.py). Empty in older reports.
    verify_curve: list[Number] = Field(default_factory=list)
    draft_costs: dict[str, Number] = Field(default_factory=dict)
    # The verify curve the timed rounds' own passes followed (tasks/evaluate/evaluated_curve.py)
    # and how many passes each size's point rests on (0: the profiled value stands). Empty
    # in older reports, or where too few one-token passes were timed.
    evaluated_curve: list[Number] = Field(default_factory=list)
    evaluated_passes: list[Count] = Field(default_factory=list)
    # The pre-gate (tasks/evaluate/pregate.py): each contender's predicted modelled speedup,
    # and the challengers left untimed with the reason (absent from the results).
    predicted_speedups: dict[str, Number | None] = Field(default_factory=dict)
    untimed: dict[str, str] = Field(default_factory=dict)
    # Challengers whose timing stopped after the first round (their wall-clock interval
    # already excluded passing), with the reason; their rows hold that one round.
    stopped_early: dict[str, str] = Field(default_factory=dict)
    # Wall seconds of the evaluation's phases: profile (drafting costs), pregate, timed.
    phase_s: dict[str, Number] = Field(default_factory=dict)
