"""NASD-style n-gram drafting: a multi-level store of k-grams, k in [2, N].

The store counts, for every context of 1..N-1 tokens, which token followed it. A request's
store is seeded from its prompt and updated as tokens are committed. Drafting chains
predictions: at each position the longest known context gives the most frequent next token
(ties go to the most recent). When no context is known the drafter falls back, as its
``fallback`` says, to:

- ``stop``: the draft ends there (the default);
- ``shared``: a shared store built from earlier traffic (a corpus file of token
  sequences, the suffix draft's format: :func:`load_shared_store`);
- ``target``: the target's own guesses from its last verification pass
  (:attr:`StepFeedback.target_guesses`): after a rejected draft, the target also
  predicted the tokens after it, conditioned on the rejected token rather than its own;
  those predictions fill the positions the store cannot (Jacobi decoding's fixed-point
  idea). They cost nothing extra, the verifier checks them like any draft (so output is
  unchanged), and they exist only after a rejection.

``min_confidence`` ends a draft at a store continuation seen less often than that share
(the target's guesses carry no frequency and are not held to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from serving.engine.drafters.args import NGRAM_FALLBACKS
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.errors import BadInputError


@dataclass(slots=True)
class _Counts:
    by_token: dict[int, int] = field(default_factory=dict)
    total: int = 0
    best_token: int = -1
    best_count: int = 0

    def add(self, token: int) -> None:
        count = self.by_token.get(token, 0) + 1
        self.by_token[token] = count
        self.total += 1
        if count >= self.best_count:  # >=: the most recent wins a tie
            self.best_token, self.best_count = token, count


@dataclass(frozen=True)
class Prediction:
    token: int
    confidence: float  # relative frequency of `token` after the matched context
    order: int  # length of the matched context + 1 (the k of the k-gram)


class NGramStore:
    """Next-token counts for contexts of 1..n-1 tokens."""

    def __init__(self, n: int = 4) -> None:
        if n < 2:
            raise BadInputError(f"an n-gram store needs n >= 2, got n={n!r}")
        self.n = n
        self._counts: dict[tuple[int, ...], _Counts] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, tokens: Sequence[int], start: int = 1) -> None:
        """Count every k-gram of ``tokens`` whose last token is at index >= ``start``."""
        for end in range(max(start, 1), len(tokens)):
            token = tokens[end]
            for width in range(1, min(self.n - 1, end) + 1):
                key = tuple(tokens[end - width : end])
                counts = self._counts.get(key)
                if counts is None:
                    counts = self._counts[key] = _Counts()
                counts.add(token)

    def predict(self, context: Sequence[int]) -> Prediction | None:
        for width in range(min(self.n - 1, len(context)), 0, -1):
            counts = self._counts.get(tuple(context[-width:]))
            if counts is not None:
                return Prediction(counts.best_token, counts.best_count / counts.total, width + 1)
        return None


def load_shared_store(path: str | Path, n: int) -> NGramStore:
    """An n-gram store of every sequence in the corpus file ``path`` (the suffix draft's
    format: :func:`serving.engine.drafters.suffix.load_suffix_corpus`, which checks it)."""
    from serving.engine.drafters.suffix import load_suffix_corpus

    store = NGramStore(n)
    for sequence in load_suffix_corpus(path).sequences:
        store.add(list(sequence))
    return store


class NGramDrafter(Drafter):
    kind = "ngram"
    deterministic = True

    def __init__(
        self,
        n: int = 4,
        *,
        fallback: str = "stop",
        shared: NGramStore | None = None,
        min_confidence: float = 0.0,
        store_source: str | None = None,
    ) -> None:
        if fallback not in NGRAM_FALLBACKS:
            raise BadInputError(
                f"unknown n-gram fallback {fallback!r}; choose one of {NGRAM_FALLBACKS}"
            )
        if fallback == "shared" and shared is None:
            raise BadInputError("fallback='shared' needs a shared NGramStore")
        if not 0.0 <= min_confidence <= 1.0:
            raise BadInputError(f"min_confidence must be in [0, 1], got {min_confidence!r}")
        self.n = n
        self.fallback = fallback
        self.shared = shared
        self.min_confidence = min_confidence
        self.store_source = store_source
        self.needs_target_guesses = fallback == "target"
        self.name = f"ngram(n={n},fallback={fallback})"
        self._store = NGramStore(n)
        self._tokens: list[int] = []
        self._guesses: tuple[int, ...] = ()

    def begin(self, prompt: list[int]) -> None:
        self._store = NGramStore(self.n)
        self._tokens = list(prompt)
        self._store.add(self._tokens)
        self._guesses = ()

    def _predict(self, context: list[int]) -> Prediction | None:
        prediction = self._store.predict(context)
        if prediction is None and self.fallback == "shared" and self.shared is not None:
            prediction = self.shared.predict(context)
        return prediction

    def propose(self, request: DraftRequest) -> DraftProposal:
        context = self._tokens[-(self.n - 1) :]
        draft: list[int] = []
        confidence: list[float] = []
        matched: list[int] = []
        while len(draft) < request.k:
            prediction = self._predict(context)
            if prediction is not None and prediction.confidence < self.min_confidence:
                break
            if prediction is None:
                if len(draft) >= len(self._guesses):  # "stop", or no guess left
                    break
                prediction = Prediction(self._guesses[len(draft)], 0.0, 1)  # no frequency
            draft.append(prediction.token)
            confidence.append(prediction.confidence)
            matched.append(prediction.order - 1)
            context = [*context, prediction.token][-(self.n - 1) :]
        return DraftProposal(  # on the CPU; the step moves it to the target's device
            torch.tensor(draft, dtype=torch.int64, device="cpu"),
            confidence=torch.tensor(confidence, dtype=torch.float32, device="cpu"),
            match_len=torch.tensor(matched, dtype=torch.int64, device="cpu"),
        )

    def commit(self, feedback: StepFeedback) -> None:
        start = len(self._tokens)
        self._tokens.extend(feedback.new_tokens)
        self._store.add(self._tokens, start=start)
        self._guesses = feedback.target_guesses if self.fallback == "target" else ()

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": "ngram_store",
            "n": self.n,
            "fallback": self.fallback,
            "min_confidence": self.min_confidence,
            **(
                {"store": self.store_source, "store_contexts": len(self.shared)}
                if self.shared is not None
                else {}
            ),
        }
