"""Prompt lookup drafting: copy what followed the latest earlier occurrence of the suffix.

Grounded answers (edits, summaries, code that repeats its input) reuse spans of the prompt
and of what was already generated. An incremental index maps every n-gram
(``min_ngram <= n <= max_ngram``) to the position after its most recent occurrence, so a
lookup is O(max_ngram) instead of a scan of the sequence. The longest matching n-gram wins.
"""

from __future__ import annotations

import torch

from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.errors import BadInputError


class PromptLookupDrafter(Drafter):
    kind = "pld"
    deterministic = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise BadInputError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got "
                f"min_ngram={min_ngram!r}, max_ngram={max_ngram!r}"
            )
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = f"pld(n={min_ngram}..{max_ngram})"
        self._tokens: list[int] = []
        self._next_pos: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it

    def begin(self, prompt: list[int]) -> None:
        self._tokens = []
        self._next_pos = {}
        self._extend(prompt)

    def _extend(self, new_tokens: list[int]) -> None:
        tokens = self._tokens
        for token in new_tokens:
            end = len(tokens)  # the n-grams ending here are followed by `token`
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._next_pos[tuple(tokens[end - n : end])] = end
            tokens.append(token)

    def _lookup(self, suffix: list[int]) -> tuple[int, int] | None:
        """``(index of the token after the match, matched n-gram length)``."""
        for n in range(min(self.max_ngram, len(suffix)), self.min_ngram - 1, -1):
            pos = self._next_pos.get(tuple(suffix[-n:]))
            if pos is not None:
                return pos, n
        return None

    def propose(self, request: DraftRequest) -> DraftProposal:
        draft: list[int] = []
        matched: list[int] = []
        while len(draft) < request.k:
            suffix = (self._tokens[-self.max_ngram :] + draft)[-self.max_ngram :]
            found = self._lookup(suffix)
            if found is None:
                break
            pos, n = found
            span = self._tokens[pos : pos + request.k - len(draft)]
            if not span:
                break
            draft.extend(span)
            matched.extend([n] * len(span))
        return DraftProposal(
            torch.tensor(draft, dtype=torch.int64, device="cpu"),
            match_len=torch.tensor(matched, dtype=torch.int64, device="cpu"),
        )

    def commit(self, feedback: StepFeedback) -> None:
        self._extend(feedback.new_tokens)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": "prompt_lookup",
            "max_ngram": self.max_ngram,
            "min_ngram": self.min_ngram,
        }
