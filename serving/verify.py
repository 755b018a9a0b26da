"""Accept or reject a block of drafts against one target pass. Pure tensor code.

Greedy: a draft is kept while it equals the target's argmax. Sampling: the rejection
sampler of Leviathan et al. / Chen et al. keeps draft ``i`` with probability
``min(1, target_probs[i, d_i] / draft_probs[i, d_i])``; at the first rejection it draws from
the residual ``max(0, target_probs - draft_probs)`` renormalised, and when every draft is
kept it draws the bonus token from the target's last row. The output is then distributed
exactly as the target's own samples. A deterministic drafter (n-gram) is the special case
of a one-hot ``draft_probs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serving.sampling import Sampler


@dataclass(frozen=True)
class Verdict:
    accepted_len: int  # how many drafts were kept, 0..k
    next_token: int  # the target's correction (after a rejection) or bonus token


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """``draft_tokens`` ``[k]``, ``target_logits`` ``[k + 1, vocab]``."""
    target_choice = target_logits.argmax(dim=-1)  # [k + 1]
    k = draft_tokens.shape[0]
    agree = (draft_tokens == target_choice[:k]).to(torch.int64)  # [k]
    accepted_len = int(agree.cumprod(dim=0).sum())  # the one host sync of the step
    return Verdict(accepted_len, int(target_choice[accepted_len]))


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampler: Sampler,
) -> Verdict:
    """Rejection sampling with residual resampling.

    ``draft_tokens`` ``[k]``; ``draft_probs`` ``[k, vocab]`` the distributions the drafts
    were drawn from, or ``None`` for a deterministic drafter; ``target_probs``
    ``[k + 1, vocab]`` the sampler's processed target distributions.
    """
    k = draft_tokens.shape[0]
    rows = torch.arange(k)
    target_p = target_probs[rows, draft_tokens]  # [k]
    draft_q = torch.ones(k) if draft_probs is None else draft_probs[rows, draft_tokens]  # [k]
    uniforms = sampler.uniform(k)  # [k]
    keep = (uniforms * draft_q < target_p).to(torch.int64)  # u < p / q, without dividing
    accepted_len = int(keep.cumprod(dim=0).sum())
    if accepted_len == k:
        return Verdict(k, int(sampler.sample(target_probs[k])))
    if draft_probs is None:
        proposal = torch.zeros_like(target_probs[accepted_len])
        proposal[draft_tokens[accepted_len]] = 1.0
    else:
        proposal = draft_probs[accepted_len]
    residual = (target_probs[accepted_len] - proposal).clamp_(min=0.0)  # [vocab]
    mass = residual.sum()
    # A zero residual means target == draft there, so a rejection had probability 0; only
    # rounding gets here, and the target row is then the exact distribution to draw from.
    residual = target_probs[accepted_len] if mass <= 0 else residual / mass
    return Verdict(accepted_len, int(sampler.sample(residual)))


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    sampler: Sampler,
) -> tuple[Verdict, torch.Tensor | None]:
    """Dispatch on the sampler. Returns the verdict and, when sampling, the target probs."""
    if sampler.greedy:
        return verify_greedy(draft_tokens, target_logits), None
    target_probs = sampler.probs(target_logits)  # [k + 1, vocab]
    return verify_sampled(draft_tokens, draft_probs, target_probs, sampler), target_probs
