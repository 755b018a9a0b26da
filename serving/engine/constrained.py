"""Speculation under a token constraint (a finite-state grammar on the target's logits).

A constrained request decodes from the target's distribution with every token the
grammar forbids masked out. Speculation stays lossless for that distribution when each
row of the verification pass is masked by the grammar's state *after the drafts before
it*: :func:`constrain_block` walks the state along the drafts and returns one mask per
row, and the step masks the target's logits with them before verifying. A forbidden draft
then has target probability 0 and is rejected like any other.

Deterministic drafts (n-gram, greedy) are cut at the first forbidden one: their rejection
there is certain, and the residual a deterministic draft leaves is the target's own row,
so nothing changes but the wasted rows. Sampled drafts (``draft_probs``) are kept whole
under sampling: cutting them would replace the residual draw at that row by a plain draw
and bias the output.
"""

from __future__ import annotations

from typing import Protocol

import torch

from serving.engine.drafters.base import DraftProposal


class ConstraintState(Protocol):
    """Where a constrained output stands; a value: ``advance`` returns a new state."""

    def allowed(self) -> torch.Tensor: ...  # bool [vocab]

    def advance(self, token: int) -> ConstraintState: ...

    def is_finished(self) -> bool: ...


class Constraint(Protocol):
    """A grammar over a vocabulary of ``vocab_size`` ids (e.g. the skeleton's)."""

    vocab_size: int

    def start(self) -> ConstraintState: ...


def constrain_block(
    proposal: DraftProposal, state: ConstraintState, *, cut: bool
) -> tuple[DraftProposal, list[ConstraintState], torch.Tensor]:
    """The proposal (cut at its first forbidden draft when ``cut``), the states after each
    allowed draft prefix (``states[i]``: after ``i`` drafts), and the row masks
    ``[1 + len(proposal), vocab]`` (rows past a forbidden draft repeat its row's mask:
    verification stops there)."""
    states = [state]
    masks = [state.allowed()]
    tokens = proposal.tokens.tolist()
    for index, token in enumerate(tokens):
        if not bool(masks[-1][token]):
            if cut:
                proposal = proposal.truncate(index)
            break
        states.append(states[-1].advance(token))
        masks.append(states[-1].allowed())
    while len(masks) < len(proposal) + 1:
        masks.append(masks[-1])
    # A complete grammar may allow nothing more; a row past its end decides nothing (the
    # output is cut there), so it stays unmasked rather than all -inf.
    masks = [mask if bool(mask.any()) else torch.ones_like(mask) for mask in masks]
    return proposal, states, torch.stack(masks)
