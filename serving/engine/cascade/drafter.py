"""The multi-stage draft cascade: several drafters in order, one block per step.

Each step the cascade asks its *eager* stages (n-gram kinds: suffix, prompt lookup, n-gram
store; a lookup costs a fraction of a millisecond) for up to ``k_max`` tokens, scores every
drafted token with the acceptance predictor (or, without one, with each stage's running
per-position acceptance), and plans with :func:`serving.engine.cascade.plan.plan` which stage's
block to verify and how far. A *lazy* stage (a head or a model draft, which pays a forward
per token) enters the plan with its running per-position acceptance and its measured cost;
when the plan picks it, it drafts that many tokens, its tokens are scored, and the plan is
made again with them in hand (it may still settle on an eager stage's block, or none).

Everything it proposes is verified exactly as any draft is (lossless unless the engine runs
relaxed): the cascade only chooses what to verify. Under sampling a model stage's block is
verified whole once drawn (its length is chosen before drawing): a choice made from the
values of sampled tokens would change the distribution the verifier corrects for.

Costs are measured as it runs: each stage's propose time, and the target's one-token pass
time from the policy (:class:`CascadePolicy`), whose ``next_k`` always offers ``k_max``:
the plan decides.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from serving.curves import curve_cost, normalise_curve
from serving.engine.cascade.plan import Choice, StageOption, plan
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.engine.drafters.kinds import EAGER_STAGES
from serving.engine.features import ContextStats, TokenFeatures, token_features
from serving.engine.policy import DraftLengthPolicy, check_k
from serving.engine.predictor import AcceptancePredictor
from serving.errors import BadInputError

TARGET_STAGE = "target"  # the stopping stage of a step that verifies no draft


@dataclass
class Stage:
    name: str  # the drafter spec it was built from (e.g. "pld:3")
    kind: str  # its stage: a serving.engine.drafters.kinds.STAGES entry
    drafter: Drafter

    @property
    def eager(self) -> bool:
        return self.kind in EAGER_STAGES


class RunningAcceptance:
    """Per-position acceptance of one stage: decayed kept/seen counts over a Beta prior."""

    def __init__(self, k_max: int, prior: float = 0.5, strength: float = 2.0) -> None:
        self.prior = [prior] * k_max
        self.strength = strength
        self.kept = [0.0] * k_max
        self.seen = [0.0] * k_max

    def probs(self, n: int) -> list[float]:
        return [
            (self.prior[j] * self.strength + self.kept[j]) / (self.strength + self.seen[j])
            for j in range(min(n, len(self.prior)))
        ]

    def update(self, proposed: int, accepted: int, decay: float = 0.9) -> None:
        self.kept = [v * decay for v in self.kept]
        self.seen = [v * decay for v in self.seen]
        for j in range(min(proposed, accepted + 1, len(self.prior))):
            kept = j < accepted
            self.kept[j] += kept
            self.seen[j] += 1.0
            self.prior[j] += 0.02 * (kept - self.prior[j])


class CascadeCosts:
    """Measured costs, shared by the cascade drafter and its policy: the target's one-token
    pass (seconds) and each stage's propose time (per call and per drafted token)."""

    def __init__(self, n_stages: int, smoothing: float = 0.2) -> None:
        self.smoothing = smoothing
        self.t_unit: float | None = None
        self.per_call = [0.0] * n_stages
        self.per_token = [0.0] * n_stages
        self._seen = [False] * n_stages

    def _avg(self, old: float, new: float, first: bool) -> float:
        return new if first else (1 - self.smoothing) * old + self.smoothing * new

    def observe_pass(self, seconds: float, relative_cost: float) -> None:
        if seconds > 0 and relative_cost > 0:
            unit = seconds / relative_cost
            self.t_unit = unit if self.t_unit is None else self._avg(self.t_unit, unit, False)

    def observe_stage(self, stage: int, seconds: float, tokens: int) -> None:
        first = not self._seen[stage]
        self._seen[stage] = True
        self.per_call[stage] = self._avg(self.per_call[stage], seconds, first)
        if tokens:
            self.per_token[stage] = self._avg(self.per_token[stage], seconds / tokens, first)

    def passes(self, seconds: float) -> float:
        """``seconds`` in one-token target passes (0 until a pass was timed)."""
        return seconds / self.t_unit if self.t_unit else 0.0


class CascadeDrafter(Drafter):
    kind = "cascade"  # no spec kind: built from its stages' specs (serving.engine.cascade.build)
    needs_context = True
    deterministic = False  # a model stage's proposals carry draft_probs under sampling

    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        k_max: int = 8,
        verify_curve: tuple[float, ...],
        predictor: AcceptancePredictor | None = None,
        costs: CascadeCosts | None = None,
        probe_every: int = 16,
    ) -> None:
        if not stages:
            raise BadInputError("a cascade needs at least one stage")
        self.stages = list(stages)
        self.k_max = check_k(k_max, name="k_max")
        self.curve = normalise_curve(verify_curve)
        self.predictor = predictor
        self.costs = costs or CascadeCosts(len(self.stages))
        self.probe_every = probe_every
        self.needs_target_hidden = any(s.drafter.needs_target_hidden for s in self.stages)
        self.deterministic = all(s.drafter.deterministic for s in self.stages)
        self.running = [RunningAcceptance(self.k_max) for _ in self.stages]
        self.stops: Counter[str] = Counter()  # this request's stopping stages
        self._proposals: list[DraftProposal | None] = [None] * len(self.stages)
        self._chosen = -1
        self._idle = 0
        self.name = "cascade(" + ">".join(s.name for s in self.stages) + ")"

    def fork(self) -> CascadeDrafter:
        twin = super().fork()
        assert isinstance(twin, CascadeDrafter)
        twin.stages = [Stage(s.name, s.kind, s.drafter.fork()) for s in self.stages]
        # Its own running acceptance (a request's evidence is its own); the measured costs
        # stay shared (one target, one machine).
        twin.running = [copy.deepcopy(r) for r in self.running]
        twin.stops = Counter()
        twin._proposals = [None] * len(self.stages)
        return twin

    def check_compatible(self, target_vocab_size: int) -> None:
        for stage in self.stages:
            stage.drafter.check_compatible(target_vocab_size)

    def begin(self, prompt: list[int]) -> None:
        for stage in self.stages:
            stage.drafter.begin(prompt)
        self.stops = Counter()
        self._proposals = [None] * len(self.stages)
        self._idle = 0

    def prefill(self, target_hidden: torch.Tensor) -> None:
        for stage in self.stages:
            if stage.drafter.needs_target_hidden:
                stage.drafter.prefill(target_hidden)

    def end(self) -> None:
        for stage in self.stages:
            stage.drafter.end()

    # ------------------------------------------------------------------------ choosing

    def _cost(self, n: int) -> float:
        return curve_cost(self.curve, n)

    def _probs(self, index: int, features: list[TokenFeatures]) -> list[float]:
        if self.predictor is None:
            return self.running[index].probs(len(features))
        return [float(p) for p in self.predictor.predict(features).tolist()]

    def _draft(
        self, index: int, request: DraftRequest, k: int, context: ContextStats
    ) -> tuple[DraftProposal, list[TokenFeatures], float]:
        stage = self.stages[index]
        started = time.perf_counter()
        proposal = stage.drafter.propose(
            DraftRequest(request.tokens, k, request.sampler, context)
        ).truncate(k)
        seconds = time.perf_counter() - started
        self.costs.observe_stage(index, seconds, len(proposal))
        features = token_features(proposal, context, stage=stage.kind, stage_index=index)
        self._proposals[index] = proposal
        return proposal, features, self.costs.passes(seconds)

    def propose(self, request: DraftRequest) -> DraftProposal:
        context = request.context or ContextStats(len(request.tokens))
        k = min(request.k, self.k_max)
        self._proposals = [None] * len(self.stages)
        self._chosen = -1
        if k < 1:
            return DraftProposal.empty()
        drafted: dict[int, tuple[DraftProposal, list[TokenFeatures]]] = {}
        options: list[StageOption] = []
        sunk = 0.0
        for index, stage in enumerate(self.stages):
            if stage.eager:
                proposal, features, spent = self._draft(index, request, k, context)
                drafted[index] = (proposal, features)
                sunk += spent
                options.append(StageOption(self._probs(index, features)))
            else:
                options.append(
                    StageOption(
                        self.running[index].probs(k),
                        token_cost=self.costs.passes(self.costs.per_token[index]),
                    )
                )
        choice = plan(options, self._cost, sunk=sunk)
        lazy = [i for i, s in enumerate(self.stages) if not s.eager]
        if choice.length == 0 and lazy:
            # Nothing pays: every probe_every such steps, one lazy-stage token anyway, so
            # that its running acceptance stays current.
            self._idle += 1
            if self._idle >= self.probe_every:
                self._idle = 0
                choice = Choice(lazy[0], 1, 1.0, 1.0)
        if choice.length and not self.stages[choice.stage].eager:
            index = choice.stage
            proposal, features, spent = self._draft(index, request, choice.length, context)
            drafted[index] = (proposal, features)
            sunk += spent
            if request.sampler.greedy:
                # Plan again with its tokens in hand; lazy stages not drafted drop out.
                options = [
                    StageOption(self._probs(i, drafted[i][1])) if i in drafted else StageOption(())
                    for i in range(len(self.stages))
                ]
                choice = plan(options, self._cost, sunk=sunk)
            else:
                # Under sampling the block is verified as drawn: choosing or cutting it by
                # the values of its own sampled tokens would skew what the verifier keeps.
                choice = Choice(index, len(proposal), 0.0, 1.0)
        if choice.length == 0:
            return DraftProposal.empty()
        proposal, features = drafted[choice.stage]
        length = min(choice.length, len(proposal))
        self._chosen = choice.stage
        chosen = proposal.truncate(length)
        return DraftProposal(
            chosen.tokens,
            chosen.draft_probs,
            chosen.confidence,
            chosen.match_len,
            tuple(features[:length]),
            stage=self.stages[choice.stage].kind,
        )

    # ---------------------------------------------------------------------- committing

    def commit(self, feedback: StepFeedback) -> None:
        # Where this step stopped (a step the engine ran without asking for drafts too).
        stopped = self.stages[self._chosen].name if self._chosen >= 0 else TARGET_STAGE
        self.stops[stopped] += 1
        for index, stage in enumerate(self.stages):
            proposal = self._proposals[index]
            if index == self._chosen:
                self.running[index].update(feedback.proposed, feedback.accepted)
                stage.drafter.commit(feedback)
                continue
            if proposal is not None and len(proposal):
                # A block not verified is still judged where the committed tokens reach:
                # its running acceptance learns from what the target chose there.
                drafts = proposal.tokens.tolist()[: len(feedback.new_tokens)]
                self.running[index].update(len(drafts), _prefix(drafts, feedback.new_tokens))
            stage.drafter.commit(_unused(feedback, proposal))
        self._proposals = [None] * len(self.stages)
        self._chosen = -1

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": "cascade",
            "stages": [stage.drafter.describe() for stage in self.stages],
            "k_max": self.k_max,
            "predictor": None if self.predictor is None else self.predictor.describe(),
        }


def _unused(feedback: StepFeedback, proposal: DraftProposal | None) -> StepFeedback:
    """The step as a stage whose block was not verified sees it: its drafts that happen to
    equal the committed tokens count as kept (a model stage keeps their cache entries)."""
    if proposal is None or len(proposal) == 0:
        return StepFeedback(0, 0, feedback.new_tokens, feedback.tokens, feedback.target_hidden)
    drafts = proposal.tokens.tolist()
    same = _prefix(drafts, feedback.new_tokens[:-1])
    return StepFeedback(
        len(drafts), same, feedback.new_tokens, feedback.tokens, feedback.target_hidden
    )


def _prefix(drafts: list[int], tokens: list[int]) -> int:
    """How many leading drafts equal the committed tokens."""
    same = 0
    for draft, token in zip(drafts, tokens, strict=False):
        if draft != token:
            break
        same += 1
    return same


class CascadePolicy(DraftLengthPolicy):
    """Offers the cascade ``k_max`` every step and times the target's passes for it."""

    def __init__(self, cascade: CascadeDrafter) -> None:
        self.cascade = cascade
        self.name = f"cascade(k_max={cascade.k_max})"

    def next_k(self) -> int:
        return self.cascade.k_max

    def update(
        self, proposed: int, accepted: int, *, draft_s: float = 0.0, verify_s: float = 0.0
    ) -> None:
        self.cascade.costs.observe_pass(verify_s, curve_cost(self.cascade.curve, proposed + 1))

    def describe(self) -> dict[str, object]:
        return {"name": "cascade", "k_max": self.cascade.k_max}
