"""The speculative step: draft k tokens, verify them in one target pass, keep the prefix.

Pure: tensors and a drafter in, accepted tokens and their provenance out. No I/O. Plain
autoregressive decoding is this step with k = 0 (the target pass then covers one token).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

import torch

from serving.engine.constrained import ConstraintState, constrain_block
from serving.engine.detailed import Rejection
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.engine.features import ContextStats, TokenFeatures, target_statistics, token_features
from serving.engine.kv import cache_length, rewind
from serving.engine.relaxed import verify_relaxed
from serving.engine.sampling import Sampler
from serving.engine.verify import verify
from serving.errors import BadInputError
from serving.target import Cache, LoadedTarget


@dataclass(frozen=True)
class StepResult:
    new_tokens: list[int]  # accepted drafts, then the target's token
    proposed: int
    accepted: int
    draft_s: float
    verify_s: float
    rejection: Rejection | None = None  # detailed mode only
    # With a context (detailed mode, or a drafter that reads it): the drafted tokens'
    # features, and the target's entropy and log-probability at each new token.
    features: tuple[TokenFeatures, ...] = ()
    entropies: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)  # the drafted tokens (with a context)
    agreed: int = 0  # drafts the target itself agreed with (== accepted unless relaxed)
    unverified: tuple[int, ...] = ()  # block indexes kept although the target disagreed
    stage: str | None = None  # the proposal's own stage (a cascade's choice), if it named one


def _draft_probs_of(proposal: DraftProposal, index: int, draft_token: int, target_token: int):
    if proposal.draft_probs is not None:
        row = proposal.draft_probs[index]
        return float(row[draft_token]), float(row[target_token])
    confidence = 1.0 if proposal.confidence is None else float(proposal.confidence[index])
    return confidence, 0.0


def _rejection(
    proposal: DraftProposal,
    index: int,
    target_token: int,
    target_logits: torch.Tensor,
    target_probs: torch.Tensor | None,
) -> Rejection:
    # Greedy decoding has no processed distribution: report the target's softmax at T = 1.
    row = target_logits[index].float().softmax(-1) if target_probs is None else target_probs[index]
    draft_token = int(proposal.tokens[index])
    draft_of_draft, draft_of_target = _draft_probs_of(proposal, index, draft_token, target_token)
    return Rejection(
        draft_index=index,
        draft_token=draft_token,
        target_token=target_token,
        target_prob_of_draft=float(row[draft_token]),
        target_prob_of_target=float(row[target_token]),
        draft_prob_of_draft=draft_of_draft,
        draft_prob_of_target=draft_of_target,
    )


class _Clock:
    """The step's draft and verify times. On CUDA the work is queued, so wall-clock marks
    would charge the draft's queued kernels to verification: CUDA events on the device's
    stream time it instead, read once the step's host sync has passed them."""

    def __init__(self, device: torch.device) -> None:
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self._events: list[torch.cuda.Event] = []
        self._times: list[float] = []

    def mark(self) -> None:
        if self._stream is None:
            self._times.append(time.perf_counter())
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        self._events.append(event)

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks."""
        if self._stream is None:
            return [b - a for a, b in itertools.pairwise(self._times)]
        self._events[-1].synchronize()  # already done: the step synced after its last kernel
        return [a.elapsed_time(b) / 1000 for a, b in itertools.pairwise(self._events)]


@dataclass(frozen=True)
class DraftedBlock:
    """A step's drafts, ready for a target pass: what :func:`settle` needs afterwards."""

    proposal: DraftProposal  # on the target's device
    block: torch.Tensor  # [1 + proposed] the pending token, then the drafts
    base: int  # cache length before the pass (``len(tokens) - 1``)
    features: tuple[TokenFeatures, ...] = ()
    # Constrained requests: [1 + proposed, vocab] the grammar's mask for each row
    # (serving.engine.constrained).
    masks: torch.Tensor | None = None

    @property
    def proposed(self) -> int:
        return len(self.proposal)


def draft_block(
    cache,
    tokens: list[int],
    drafter: Drafter | None,
    k: int,
    sampler: Sampler,
    *,
    device: torch.device,
    context: ContextStats | None = None,
    stage: str = "model",
    constraint: ConstraintState | None = None,
) -> DraftedBlock:
    """Draft up to ``k`` tokens after ``tokens``; ``cache`` holds ``tokens[:-1]``.
    ``constraint``: the grammar's state after ``tokens`` (a constrained request)."""
    if sampler.device is not None and sampler.device.type != device.type:
        raise BadInputError(
            f"the sampler draws on {sampler.device} but the target is on {device}; make it "
            f"with make_sampler(..., device={str(device)!r})"
        )
    base = cache_length(cache)
    assert base == len(tokens) - 1, f"cache holds {base} tokens, expected {len(tokens) - 1}"
    proposal = DraftProposal.empty()
    if drafter is not None and k > 0:
        proposal = drafter.propose(DraftRequest(tokens, k, sampler, context)).truncate(k)
    features: tuple[TokenFeatures, ...] = ()
    masks: torch.Tensor | None = None
    if constraint is not None:
        cut = sampler.greedy or proposal.draft_probs is None
        proposal, _, masks = constrain_block(proposal, constraint, cut=cut)
        masks = masks.to(device)
    if context is not None and len(proposal):
        features = proposal.features or tuple(token_features(proposal, context, stage=stage))
    # n-gram drafters propose on the CPU: their drafts meet the target's logits here.
    drafts = proposal.to(device)
    pending = torch.tensor(tokens[-1:], dtype=torch.int64, device=device)  # [1]
    block = torch.cat([pending, drafts.tokens])  # [1 + proposed]
    return DraftedBlock(drafts, block, base, features, masks)


def settle(
    drafted: DraftedBlock,
    target_logits: torch.Tensor | None,
    cache,
    tokens: list[int],
    drafter: Drafter | None,
    sampler: Sampler,
    *,
    hidden: torch.Tensor | None = None,
    detailed: bool = False,
    context: ContextStats | None = None,
    relax: tuple[float, float] | None = None,
) -> StepResult:
    """Verify ``drafted`` against the target pass's ``target_logits`` ``[1 + proposed,
    vocab]`` (``hidden`` ``[1 + proposed, hidden]`` for drafters that read it), keep the
    accepted prefix, rewind ``cache`` and tell the drafter. ``target_logits`` ``None``: the
    pass failed; nothing is kept, both caches are rewound, and the caller re-raises.
    Times are the caller's (zero here)."""
    proposal, base, proposed = drafted.proposal, drafted.base, drafted.proposed
    keep = base  # on failure, rewind to where we started
    accepted = 0
    new_tokens: list[int] = []
    kept_hidden = None
    guesses: tuple[int, ...] = ()
    rejection = None
    unverified: tuple[int, ...] = ()
    entropies: list[float] = []
    logprobs: list[float] = []
    try:
        if target_logits is None:
            raise _PassFailed
        if drafted.masks is not None:
            # The constrained target: forbidden tokens have probability 0 in every row.
            target_logits = target_logits.masked_fill(~drafted.masks, float("-inf"))
        if relax is not None and proposed:
            if not sampler.greedy:
                raise BadInputError("relaxed verification (a finite λ) needs greedy decoding")
            relaxed = verify_relaxed(
                proposal.tokens, target_logits, lam=relax[0], tokens_per_pass=relax[1]
            )
            verdict, target_probs, unverified = relaxed.verdict, None, relaxed.unverified
        else:
            verdict, target_probs = verify(
                proposal.tokens, proposal.draft_probs, target_logits, sampler
            )
        accepted = verdict.accepted_len
        # The drafter's own tensor: free for CPU drafts, a copy from the idle GPU otherwise.
        new_tokens = [*proposal.tokens[:accepted].tolist(), verdict.next_token]
        keep = base + 1 + accepted  # the pending token and the accepted drafts
        if hidden is not None:
            kept_hidden = hidden[: accepted + 1]  # [accepted + 1, hidden]
        if drafter is not None and drafter.needs_target_guesses and accepted < proposed:
            guesses = tuple(target_logits[accepted + 1 : proposed + 1].argmax(dim=-1).tolist())
        if context is not None:
            entropies, logprobs = target_statistics(target_logits, new_tokens)
        if detailed and accepted < proposed:
            rejection = _rejection(
                proposal, accepted, verdict.next_token, target_logits, target_probs
            )
    except _PassFailed:
        pass
    finally:
        # The one place both caches are rewound: the target drops rejected drafts here,
        # the drafter drops its own in commit().
        rewind(cache, keep)
        if drafter is not None:
            drafter.commit(
                StepFeedback(
                    proposed=proposed,
                    accepted=accepted,
                    new_tokens=new_tokens,
                    tokens=tokens + new_tokens,
                    target_hidden=kept_hidden,
                    target_guesses=guesses,
                )
            )
    return StepResult(
        new_tokens=new_tokens,
        proposed=proposed,
        accepted=accepted,
        draft_s=0.0,
        verify_s=0.0,
        rejection=rejection,
        features=drafted.features,
        drafts=proposal.tokens.tolist() if drafted.features else [],
        entropies=entropies,
        logprobs=logprobs,
        agreed=min((accepted, *unverified)),
        unverified=unverified,
        stage=proposal.stage,
    )


class _PassFailed(Exception):
    """The target pass raised: settle only rewinds."""


@torch.inference_mode()
def speculative_step(
    target: LoadedTarget,
    cache: Cache,
    tokens: list[int],
    drafter: Drafter | None,
    k: int,
    sampler: Sampler,
    *,
    detailed: bool = False,
    device: torch.device | None = None,
    context: ContextStats | None = None,
    stage: str = "model",
    relax: tuple[float, float] | None = None,
    constraint: ConstraintState | None = None,
) -> StepResult:
    """Advance one step. ``cache`` holds ``tokens[:-1]``; on return it holds the new
    ``tokens[:-1]`` (every kept token but the target's own, which is fed next step).

    ``device``: the target's (the engine computes it once); every tensor the step hands the
    target or the verifier is on it, and a sampling ``sampler`` must draw there too.
    ``context``: the request's target statistics; when given, the drafter sees them, the
    drafted tokens' features (as ``stage``) and the new tokens' statistics come back.
    ``relax``: ``(λ, tokens per pass)`` for relaxed verification (greedy only; see
    :mod:`serving.engine.relaxed`); ``None`` verifies exactly. ``constraint``: the grammar's state
    after ``tokens`` for a constrained request (:mod:`serving.engine.constrained`). A batch of
    sequences takes the same two halves, :func:`draft_block` and :func:`settle`, around one
    packed pass (:mod:`serving.engine.batch`)."""
    device = target.device if device is None else device
    clock = _Clock(device)
    clock.mark()
    drafted = draft_block(
        cache,
        tokens,
        drafter,
        k,
        sampler,
        device=device,
        context=context,
        stage=stage,
        constraint=constraint,
    )
    clock.mark()
    want_hidden = drafter is not None and drafter.needs_target_hidden
    try:
        out = target(
            input_ids=drafted.block[None],
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=want_hidden,
        )
    except BaseException:
        settle(drafted, None, cache, tokens, drafter, sampler)
        raise
    hidden = out.hidden_states[-1][0] if want_hidden else None
    result = settle(
        drafted,
        out.logits[0],  # [1 + proposed, vocab]
        cache,
        tokens,
        drafter,
        sampler,
        hidden=hidden,
        detailed=detailed,
        context=context,
        relax=relax,
    )
    clock.mark()
    draft_s, verify_s = clock.intervals()
    return replace(result, draft_s=draft_s, verify_s=verify_s)
