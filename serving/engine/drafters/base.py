"""The drafter interface.

The engine calls, per request: ``begin(prompt)``; then per step ``propose(request)`` (only
when the draft-length policy asks for k > 0) and always ``commit(...)`` with what the
target kept. A drafter that reads the target's hidden states (EAGLE-style) sets
``needs_target_hidden``: it receives the prompt's in ``prefill`` (right after ``begin``) and
each step's in ``commit``; nothing in the step changes.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from serving.engine.features import ContextStats, TokenFeatures
from serving.engine.sampling import Sampler


@dataclass(frozen=True)
class DraftRequest:
    tokens: list[int]  # every committed token of the request, prompt first; the last is not
    # yet in the target's KV cache
    k: int  # propose at most this many tokens
    sampler: Sampler  # the request's sampler: a sampling drafter draws from sampler.probs
    # The target's recent statistics (entropy, log-probabilities, lengths), for drafters that
    # decide with the acceptance predictor (the cascade); None when nobody asked for them.
    context: ContextStats | None = None


@dataclass(frozen=True)
class DraftProposal:
    tokens: torch.Tensor  # [k'] int64, k' <= k (may be empty)
    # [k', vocab] the distribution each token was drawn from; None for a deterministic
    # drafter, which the verifier treats as one-hot.
    draft_probs: torch.Tensor | None = None
    # [k'] the drafter's own confidence in each token (e.g. an n-gram's relative frequency),
    # recorded in detailed mode when draft_probs is None.
    confidence: torch.Tensor | None = None
    # [k'] how many context tokens an n-gram drafter matched to propose each token (a
    # feature of the acceptance predictor); None for model drafters.
    match_len: torch.Tensor | None = None
    # One TokenFeatures per token, when the drafter computed them (the cascade does, to
    # choose); otherwise the step computes them from the fields above when asked.
    features: tuple[TokenFeatures, ...] | None = None
    # The stage its tokens come from when a drafter of several (the cascade) chose among
    # them; None: the drafter's own (its kind's stage).
    stage: str | None = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 1:
            raise ValueError(f"draft tokens must be 1-D, got shape {tuple(self.tokens.shape)}")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def truncate(self, k: int) -> DraftProposal:
        if len(self) <= k:
            return self
        return DraftProposal(
            self.tokens[:k],
            None if self.draft_probs is None else self.draft_probs[:k],
            None if self.confidence is None else self.confidence[:k],
            None if self.match_len is None else self.match_len[:k],
            None if self.features is None else self.features[:k],
            self.stage,
        )

    def to(self, device: torch.device) -> DraftProposal:
        """The proposal on ``device`` (itself when it is already there)."""
        if self.tokens.device == device:
            return self
        return DraftProposal(
            self.tokens.to(device),
            None if self.draft_probs is None else self.draft_probs.to(device),
            None if self.confidence is None else self.confidence.to(device),
            self.match_len,  # read on the host only
            self.features,
            self.stage,
        )

    @staticmethod
    def empty() -> DraftProposal:
        return DraftProposal(torch.empty(0, dtype=torch.int64, device="cpu"))


@dataclass(frozen=True)
class StepFeedback:
    """What the target decided in one step, given to the drafter."""

    proposed: int  # drafts proposed this step (0 when the policy skipped drafting)
    accepted: int  # drafts kept
    new_tokens: list[int]  # tokens committed this step: accepted drafts + the target's token
    tokens: list[int]  # all committed tokens after this step
    # [accepted + 1, hidden] the target's last hidden states at the committed positions,
    # only for drafters with needs_target_hidden.
    target_hidden: torch.Tensor | None = None
    # The target's own guesses for the tokens after the committed ones, only for drafters
    # with needs_target_guesses: the argmax of the verification rows past the first
    # rejected draft. Those rows were conditioned on that draft instead of the target's
    # token, so they are guesses (as in Jacobi decoding), often right when the mistake was
    # local; a draft made of them is verified like any other. Empty when every draft was
    # accepted (the last row gave the target's own token).
    target_guesses: tuple[int, ...] = ()


def draw_draft(logits: torch.Tensor, sampler: Sampler) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token, row)`` for one draft position of a model-based drafter: the argmax under
    greedy decoding (``row`` the full softmax, kept for detailed records and confidence
    thresholds), otherwise a draw from ``row = sampler.probs(logits)``, the distribution the
    verifier must see. ``logits`` ``[vocab]``."""
    if sampler.greedy:
        return logits.argmax(), logits.float().softmax(dim=-1)
    row = sampler.probs(logits)
    return sampler.sample(row), row


class Drafter(ABC):
    """Proposes draft tokens for one request at a time."""

    name: str = "drafter"
    # Its kind (serving.engine.drafters.kinds), which says the stage its drafted tokens are
    # recorded and predicted under; a drafter of no registered kind drafts as "model".
    kind: str = "drafter"
    needs_target_hidden: bool = False
    # It reads DraftRequest.context (the target's recent statistics; the cascade does): the
    # engine keeps them up to date for it even outside detailed mode.
    needs_context: bool = False
    needs_target_guesses: bool = False  # StepFeedback.target_guesses
    deterministic: bool = True  # False: proposals carry draft_probs under sampling

    @abstractmethod
    def begin(self, prompt: list[int]) -> None:
        """Start a new request; forget the previous one."""

    @abstractmethod
    def propose(self, request: DraftRequest) -> DraftProposal:
        """Return at most ``request.k`` tokens continuing ``request.tokens``."""

    @abstractmethod
    def commit(self, feedback: StepFeedback) -> None:
        """Learn what was kept; rewind any state that covered rejected drafts."""

    def prefill(self, target_hidden: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Only for ``needs_target_hidden``: the target's last hidden states of the prompt's
        tokens but the last (those in the target's cache), ``[len(prompt) - 1, hidden]``."""

    def end(self) -> None:  # noqa: B027 - optional hook
        """Release per-request state (caches)."""

    def fork(self) -> Drafter:
        """A drafter for another, concurrent request, sharing this one's read-only parts
        (weights, a shared store). The default is a shallow copy, which is right for every
        drafter whose ``begin`` assigns its per-request state afresh (never mutating, in
        place, an object made in ``__init__``); override it otherwise."""
        return copy.copy(self)

    def check_compatible(self, target_vocab_size: int) -> None:  # noqa: B027 - optional hook
        """Raise :class:`IncompatibleDraftError` if this drafter cannot serve the target."""

    def describe(self) -> dict[str, object]:
        return {"name": self.name}
