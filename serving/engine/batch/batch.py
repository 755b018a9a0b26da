"""A running batch: requests join and leave between steps; each step is one packed pass.

Each member is a :class:`serving.engine.decoder.Decoding` — its own drafter, policy, sampler,
caches and budget — so joining a batch changes nothing about what a request outputs (the
packed pass is batch-invariant, :mod:`serving.engine.batch.ragged`); only its draft length is
chosen for the batch (:mod:`serving.engine.batch.plan`).

A step drafts for every member, runs one pass over all blocks and settles each member on
its own rows. A member whose drafter raises leaves with that error and the others step on.
A packed pass that raises is not attributable to one member: every member's caches are
rewound and each is stepped alone instead, so only a member whose own pass fails errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from serving.curves import BatchLimits, PassCost
from serving.engine.batch.plan import Member, plan_batch
from serving.engine.batch.ragged import packed_pass, use_ragged_attention
from serving.engine.decoder import Decoding
from serving.engine.kv import rewind
from serving.engine.policy import CostAwareK
from serving.engine.request import GenerationResult, TokenEvent
from serving.engine.step import DraftedBlock
from serving.errors import BadInputError
from serving.target import LoadedTarget

log = logging.getLogger(__name__)


@dataclass
class StepOutcome:
    """What one batch step did to each member."""

    events: dict[Decoding, list[TokenEvent]] = field(default_factory=dict)
    errors: dict[Decoding, Exception] = field(default_factory=dict)
    rows: int = 0  # tokens in the packed pass
    size: int = 0  # requests in it
    pass_s: float = 0.0


class Batch:
    """The requests decoding together on one target. Not thread-safe: one thread steps it."""

    def __init__(
        self,
        target: LoadedTarget,
        limits: BatchLimits | None = None,
        cost: PassCost | None = None,
    ) -> None:
        use_ragged_attention(target.model)
        self.target = target
        self.limits = limits or BatchLimits()
        self.cost = cost or PassCost()
        self.members: list[Decoding] = []

    def __len__(self) -> int:
        return len(self.members)

    @property
    def full(self) -> bool:
        return len(self.members) >= self.limits.max_sequences

    def join(self, decoding: Decoding) -> None:
        """Prefill ``decoding`` (alone: prompts differ too much in length to pack well) and
        add it; it rides from the next step on."""
        if decoding.decoder.target is not self.target:
            raise BadInputError("a request joins the batch of its own target only")
        if self.full:
            raise BadInputError(f"the batch is full ({self.limits.max_sequences} requests)")
        if any(m.decoder is decoding.decoder for m in self.members):
            raise BadInputError(
                "two requests in one batch share a decoder (and its drafter's state): give "
                "each request its own SpeculativeDecoder"
            )
        with torch.inference_mode():
            decoding.prefill()
        self.members.append(decoding)

    def leave(self, decoding: Decoding) -> None:
        """Take ``decoding`` out (done, cancelled or failed); its drafter is released."""
        if decoding in self.members:
            self.members.remove(decoding)
        decoding.release()

    def _plan(self, members: Sequence[Decoding]) -> list[int]:
        planned = []
        for decoding in members:
            policy = decoding.decoder.policy
            solo = decoding.next_k()  # the policy's own choice (and its probe schedule)
            cost_aware: CostAwareK | None = None
            cap = solo
            if isinstance(policy, CostAwareK):
                rates = policy.rates()
                # A probe (k > 0 where no k pays) keeps the estimates current: keep it.
                if not (solo > 0 and max(rates) == rates[0]):
                    cost_aware = policy
                    cap = min(decoding.remaining - 1, policy.k_max)
            steps = decoding.request.steps
            planned.append(
                Member(
                    k=solo,
                    cap=max(cap, 0),
                    policy=cost_aware,
                    accepted=sum(s.accepted for s in steps),
                    drafted=sum(s.proposed for s in steps),
                )
            )
        return plan_batch(planned, self.cost, budget=self.limits.max_tokens_per_pass)

    @torch.inference_mode()
    def step(self) -> StepOutcome:
        """One packed pass for every member; members that finish or fail stay in the batch
        until the caller makes them :meth:`leave`."""
        outcome = StepOutcome()
        members = [d for d in self.members if not d.done]
        if not members:
            return outcome
        drafted: dict[Decoding, DraftedBlock] = {}
        draft_s: dict[Decoding, float] = {}
        for decoding, k in zip(members, self._plan(members), strict=True):
            started = time.perf_counter()
            try:
                drafted[decoding] = decoding.draft(k)
            except Exception as error:  # this request's drafter: it alone fails
                log.exception("a drafter failed inside the batch")
                outcome.errors[decoding] = error
            draft_s[decoding] = time.perf_counter() - started
        verify_drafted(self.target, self.cost, drafted, draft_s, outcome)
        return outcome


def verify_drafted(
    target: LoadedTarget,
    cost: PassCost,
    drafted: dict[Decoding, DraftedBlock],
    draft_s: dict[Decoding, float],
    outcome: StepOutcome,
) -> None:
    """One packed pass over every drafted block, then each request settled on its own
    rows, into ``outcome``. Whoever drafted the blocks (a batch's members, or a remote
    client's sessions, :mod:`serving.distributed`) is the caller's business."""
    riding = list(drafted)
    if not riding:
        return
    blocks = [drafted[d].block for d in riding]
    outcome.rows = sum(int(b.shape[0]) for b in blocks)
    outcome.size = len(riding)
    started = time.perf_counter()
    try:
        packed = packed_pass(
            target,
            [d.cache for d in riding],
            blocks,
            want_hidden=[d.wants_hidden for d in riding],
        )
    except Exception:
        log.exception("a packed pass failed; passing its %d requests alone", len(riding))
        _pass_alone(target, riding, drafted, draft_s, outcome)
        return
    if target.device.type == "cuda":
        torch.cuda.synchronize(target.device)
    pass_s = outcome.pass_s = time.perf_counter() - started
    whole = cost(outcome.rows)
    for decoding, logits, hidden in zip(riding, packed.logits, packed.hidden, strict=True):
        block = drafted[decoding]
        # The policy reads a one-token pass's time off the batch: pass_s / C(rows).
        own = pass_s * cost(1 + block.proposed) / whole
        try:
            outcome.events[decoding] = decoding.settle(
                block,
                logits,
                hidden=hidden,
                draft_s=draft_s[decoding],
                verify_s=pass_s,
                policy_verify_s=own,
            )
        except Exception as error:
            log.exception("a request failed while settling its step")
            outcome.errors[decoding] = error


def _pass_alone(
    target: LoadedTarget,
    members: Sequence[Decoding],
    drafted: dict[Decoding, DraftedBlock],
    draft_s: dict[Decoding, float],
    outcome: StepOutcome,
) -> None:
    """Each member's drafted block through a pass of its own (after a packed pass
    failed): only a member whose own pass fails errors."""
    for decoding in members:
        block = drafted[decoding]
        rewind(decoding.cache, block.base)  # drop what the failed pass appended
        started = time.perf_counter()
        try:
            out = target(
                input_ids=block.block[None],
                past_key_values=decoding.cache,
                use_cache=True,
                output_hidden_states=decoding.wants_hidden,
            )
        except Exception as error:
            decoding.settle(block, None)  # rewinds both caches
            outcome.errors[decoding] = error
            continue
        hidden = out.hidden_states[-1][0] if decoding.wants_hidden else None
        pass_s = time.perf_counter() - started
        try:
            outcome.events[decoding] = decoding.settle(
                block,
                out.logits[0],
                hidden=hidden,
                draft_s=draft_s[decoding],
                verify_s=pass_s,
            )
        except Exception as error:
            outcome.errors[decoding] = error


def decode_together(
    decodings: Sequence[Decoding],
    target: LoadedTarget,
    *,
    limits: BatchLimits | None = None,
    cost: PassCost | None = None,
) -> list[GenerationResult]:
    """Decode every request through one batch, joining in order as room opens, and return
    their results in the same order. A request that fails raises here (after the others'
    drafters are released)."""
    batch = Batch(target, limits, cost)
    waiting = list(decodings)
    results: dict[Decoding, GenerationResult] = {}
    try:
        while waiting or batch.members:
            while waiting and not batch.full:
                batch.join(waiting.pop(0))
            outcome = batch.step()
            for error in outcome.errors.values():
                raise error
            for decoding in [d for d in batch.members if d.done]:
                batch.leave(decoding)
                results[decoding] = decoding.finish()
    finally:
        for decoding in [*batch.members, *waiting]:
            decoding.release()
    return [results[d] for d in decodings]
