"""Per-draft-token features: what the acceptance predictor sees, and what records keep.

For every drafted token the engine knows, before the target checks it: which drafter (the
cascade *stage*) proposed it and where in the block, the drafter's confidence and the
entropy of its distribution (model drafters), how long a context an n-gram drafter matched,
and three statistics of the request so far - the target's mean entropy and mean
log-probability over its last ``CONTEXT_WINDOW`` output tokens, and the output/prompt length
ratio. ``ContextStats`` keeps those statistics up to date from each step's target logits;
``token_features`` turns a proposal into one :class:`TokenFeatures` per drafted token.
A record adds the label (:class:`DraftedToken`: did the target accept it?).

``FEATURE_SET`` names this exact set: a predictor trained on another refuses to load.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass

import torch

FEATURE_SET = "specops-features/1"
CONTEXT_WINDOW = 32  # output tokens the target statistics average over


@dataclass(frozen=True)
class TokenFeatures:
    stage: str  # one of serving.engine.drafters.kinds.STAGES
    stage_index: int  # the stage's place in the cascade (0 for a single drafter)
    position: int  # 0-based place in the draft block
    draft_confidence: float | None  # the drafter's probability / relative frequency
    draft_entropy: float | None  # nats, of the drafter's distribution (model drafters)
    match_len: int | None  # context tokens an n-gram drafter matched
    target_entropy: float  # nats, mean over the last CONTEXT_WINDOW output tokens
    recent_logprob: float  # mean target log-probability of those tokens
    length_ratio: float  # output tokens so far / prompt tokens


@dataclass(frozen=True)
class DraftedToken(TokenFeatures):
    """A drafted token as the detailed record and the stored record keep it (one type from
    the engine to the store; the record checks its values, serving.records.schema): its
    features, the step, and the verdict. Ranges are checked by validation."""

    step: int  # index of the verification step (< the record's checks)
    token: int  # the drafted token id
    accepted: bool  # the target's own choice agreed (greedy) / the sampler kept it
    kept: bool  # in the output: accepted, or kept unverified by relaxed mode

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class ContextStats:
    """The request's running target statistics (the predictor's context features)."""

    def __init__(self, prompt_tokens: int, window: int = CONTEXT_WINDOW) -> None:
        self.prompt_tokens = max(int(prompt_tokens), 1)
        self.output_tokens = 0
        self._entropy: deque[float] = deque(maxlen=window)
        self._logprob: deque[float] = deque(maxlen=window)

    def observe(self, entropies: list[float], logprobs: list[float], emitted: int) -> None:
        self._entropy.extend(entropies)
        self._logprob.extend(logprobs)
        self.output_tokens += emitted

    @property
    def target_entropy(self) -> float:
        return sum(self._entropy) / len(self._entropy) if self._entropy else 0.0

    @property
    def recent_logprob(self) -> float:
        return sum(self._logprob) / len(self._logprob) if self._logprob else 0.0

    @property
    def length_ratio(self) -> float:
        return self.output_tokens / self.prompt_tokens


def target_statistics(logits: torch.Tensor, tokens: list[int]) -> tuple[list[float], list[float]]:
    """Entropy (nats) of the target's softmax at each row and log-probability of the token
    that was kept there. ``logits`` ``[n, vocab]``, ``tokens`` the n kept tokens."""
    n = len(tokens)
    if n == 0:
        return [], []
    logp = logits[:n].float().log_softmax(dim=-1)  # [n, vocab]
    entropy = -(logp.exp() * logp).sum(dim=-1)  # [n]
    index = torch.tensor(tokens, dtype=torch.int64, device=logp.device)[:, None]
    chosen = logp.gather(1, index)[:, 0]  # [n]
    both = torch.stack([entropy, chosen]).tolist()  # one host sync
    return both[0], [max(v, -100.0) for v in both[1]]


def _entropy_rows(probs: torch.Tensor) -> list[float]:
    p = probs.float().clamp_min(1e-30)
    return (-(p * p.log()).sum(dim=-1)).tolist()


def token_features(
    proposal, context: ContextStats, *, stage: str, stage_index: int = 0
) -> list[TokenFeatures]:
    """One feature row per drafted token of ``proposal`` (a ``DraftProposal``), drafted with
    ``context`` as it stood before the step."""
    n = len(proposal)
    if n == 0:
        return []
    confidence: list[float | None] = [None] * n
    entropy: list[float | None] = [None] * n
    if proposal.draft_probs is not None:
        rows = proposal.draft_probs[:n]
        index = proposal.tokens[:n].to(rows.device)[:, None]
        confidence = [float(v) for v in rows.gather(1, index)[:, 0].tolist()]
        entropy = [float(v) for v in _entropy_rows(rows)]
    elif proposal.confidence is not None:
        confidence = [float(v) for v in proposal.confidence[:n].tolist()]
    matched: list[int | None] = [None] * n
    if proposal.match_len is not None:
        matched = [int(v) for v in proposal.match_len[:n].tolist()]
    shared = {
        "target_entropy": context.target_entropy,
        "recent_logprob": context.recent_logprob,
        "length_ratio": context.length_ratio,
    }
    return [
        TokenFeatures(
            stage=stage,
            stage_index=stage_index,
            position=i,
            draft_confidence=_finite(confidence[i]),
            draft_entropy=_finite(entropy[i]),
            match_len=matched[i],
            **shared,
        )
        for i in range(n)
    ]


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value
