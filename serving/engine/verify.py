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

from serving.engine.sampling import Sampler


@dataclass(frozen=True)
class Verdict:
    accepted_len: int  # how many drafts were kept, 0..k
    next_token: int  # the target's correction (after a rejection) or bonus token


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """``draft_tokens`` ``[k]``, ``target_logits`` ``[k + 1, vocab]``, on one device."""
    target_choice = target_logits.argmax(dim=-1)  # [k + 1]
    k = draft_tokens.shape[0]
    agree = (draft_tokens == target_choice[:k]).to(torch.int64)  # [k]
    accepted_len = agree.cumprod(dim=0).sum()  # [] on the device
    # The one host sync of the step: the accepted count and the target's choices together.
    count, *choices = torch.cat([accepted_len.view(1), target_choice]).tolist()
    return Verdict(count, choices[count])


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampler: Sampler,
) -> Verdict:
    """Rejection sampling with residual resampling.

    ``draft_tokens`` ``[k]``; ``draft_probs`` ``[k, vocab]`` the distributions the drafts
    were drawn from, or ``None`` for a deterministic drafter; ``target_probs``
    ``[k + 1, vocab]`` the sampler's processed target distributions. All on the sampler's
    device. The accepted count stays on the device until the one host sync at the end.
    """
    k = draft_tokens.shape[0]
    if k == 0:
        return Verdict(0, int(sampler.sample(target_probs[0])))
    rows = torch.arange(k, device=target_probs.device)
    target_p = target_probs[rows, draft_tokens]  # [k]
    draft_q = target_p.new_ones(k) if draft_probs is None else draft_probs[rows, draft_tokens]
    uniforms = sampler.uniform(k)  # [k]
    keep = (uniforms * draft_q < target_p).to(torch.int64)  # u < p / q, without dividing
    accepted_len = keep.cumprod(dim=0).sum().view(1)  # [1]
    # The row to draw from: the bonus row when every draft was kept, otherwise the residual
    # max(0, target - draft) at the first rejection (index_select: no host sync).
    target_row = target_probs.index_select(0, accepted_len)[0]  # [vocab]
    rejected_at = accepted_len.clamp(max=k - 1)  # [1] the draft row (unused if all kept)
    if draft_probs is None:
        draft_row = torch.zeros_like(target_row)
        draft_row.index_fill_(0, draft_tokens.index_select(0, rejected_at), 1.0)
    else:
        draft_row = draft_probs.index_select(0, rejected_at)[0]  # [vocab]
    residual = (target_row - draft_row).clamp_(min=0.0)  # [vocab]
    mass = residual.sum()
    # A zero residual means target == draft there, so a rejection had probability 0; only
    # rounding gets here, and the target row is then the exact distribution to draw from.
    residual = torch.where(mass > 0, residual / mass, target_row)
    row = torch.where(accepted_len == k, target_row, residual)  # [vocab]
    drawn = sampler.sample(row).view(1)  # [1]
    count, token = torch.cat([accepted_len, drawn]).tolist()  # the one host sync
    return Verdict(count, token)


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
