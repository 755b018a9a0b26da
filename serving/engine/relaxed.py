"""Relaxed verification: keep a draft token the target disagrees with when, weighted by λ,
the quality it costs is below the time it saves. Opt-in, greedy decoding only.

At a disagreement at block index ``j`` (draft ``d_j``, target's choice ``a_j``), stopping
emits ``j + 1`` tokens; keeping ``d_j`` lets the same pass go on to the next disagreement
``m`` (or the block's end, where the bonus row answers), emitting ``m + 1``: a gain of
``m - j`` tokens, worth ``(m - j) / r`` target passes at ``r`` tokens per pass. The quality
it costs is the target's own judgement of the swap, the log-probability it gives up,
``q_j = log p(a_j) - log p(d_j)`` nats (the logit gap; 0 would be a tie). The token is kept
when ``λ · q_j < (m - j) / r``: a small λ favours speed (λ = 0.1 keeps all but drafts the
target finds e^10 times less likely), a large one quality (λ = 10 keeps near-ties only),
and ``λ = ∞`` never keeps one - exactly lossless.

The rows after a kept token were computed by the target *conditioned on it* (it is in the
block), so everything after it is verified exactly as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from serving.engine.verify import Verdict
from serving.errors import BadInputError


def check_lambda(value: object) -> float:
    """λ in (0, ∞]; ``None``, ``"inf"`` and ``math.inf`` mean lossless."""
    if value is None:
        return math.inf
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise BadInputError(f"λ must be a number in (0, inf], got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"λ must be a number in (0, inf], got {value!r}")
    lam = float(value)
    if math.isnan(lam) or lam <= 0:
        raise BadInputError(f"λ must be in (0, inf] (inf = lossless), got {value!r}")
    return lam


@dataclass(frozen=True)
class RelaxedVerdict:
    verdict: Verdict  # accepted_len counts kept tokens, verified or not
    unverified: tuple[int, ...]  # block indexes kept although the target disagreed


def verify_relaxed(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    lam: float,
    tokens_per_pass: float,
) -> RelaxedVerdict:
    """``draft_tokens`` ``[k]``, ``target_logits`` ``[k + 1, vocab]``; greedy target."""
    choice = target_logits.argmax(dim=-1)  # [k + 1]
    k = int(draft_tokens.shape[0])
    drafts = draft_tokens.tolist()
    chosen = choice.tolist()
    agree = [drafts[i] == chosen[i] for i in range(k)]
    rate = max(float(tokens_per_pass), 1.0)
    unverified: list[int] = []
    j = 0
    while j < k:
        if agree[j]:
            j += 1
            continue
        if math.isinf(lam):
            break
        m = next((i for i in range(j + 1, k) if not agree[i]), k)
        row = target_logits[j].float()
        quality_loss = max(0.0, float(row[chosen[j]] - row[drafts[j]]))  # nats
        if lam * quality_loss < (m - j) / rate:
            unverified.append(j)
            j += 1
            continue
        break
    return RelaxedVerdict(Verdict(j, int(chosen[j])), tuple(unverified))
