"""Draft-length policies: how many tokens to draft in the next step.

A policy sees only what each step proposed and kept. ``FixedK`` always asks for k;
``AdaptiveK`` is Hugging Face's "heuristic" schedule (+2 after a fully accepted block,
-1 otherwise, within [1, k_max]). Learned policies (the predictor issue) implement the
same two methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from serving.errors import BadInputError

MAX_DRAFT_TOKENS = 64  # a block longer than this costs more to verify than it can pay


def check_k(k: object, *, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise BadInputError(f"{name} must be an integer, got {k!r}")
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise BadInputError(f"{name} must be between 1 and {MAX_DRAFT_TOKENS}, got {k}")
    return k


class DraftLengthPolicy(ABC):
    name = "policy"

    def begin(self) -> None:  # noqa: B027 - optional hook
        """A new request starts."""

    @abstractmethod
    def next_k(self) -> int:
        """Drafts to ask for in the next step (0 = decode one token without drafting)."""

    @abstractmethod
    def update(self, proposed: int, accepted: int) -> None:
        """Learn from the step just verified."""

    def describe(self) -> dict[str, object]:
        return {"name": self.name}


class FixedK(DraftLengthPolicy):
    def __init__(self, k: int) -> None:
        self.k = check_k(k)
        self.name = f"fixed(k={k})"

    def next_k(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        return None

    def describe(self) -> dict[str, object]:
        return {"name": "fixed", "k": self.k}


class AdaptiveK(DraftLengthPolicy):
    def __init__(self, k: int, *, k_max: int | None = None) -> None:
        self.k_start = check_k(k)
        self.k_max = check_k(k_max if k_max is not None else max(k, 2 * k), name="k_max")
        self.k = self.k_start
        self.name = f"adaptive(k={k},max={self.k_max})"

    def begin(self) -> None:
        self.k = self.k_start

    def next_k(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        if accepted == proposed:
            self.k = min(self.k + 2, self.k_max)
        else:
            self.k = max(self.k - 1, 1)

    def describe(self) -> dict[str, object]:
        return {"name": "adaptive", "k": self.k_start, "k_max": self.k_max}


class NoDraft(DraftLengthPolicy):
    name = "none"

    def next_k(self) -> int:
        return 0

    def update(self, proposed: int, accepted: int) -> None:
        return None
