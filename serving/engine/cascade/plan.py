"""Which stage drafts, and how far: a dynamic programme over stages and block lengths.

Each stage ``s`` offers up to ``K_s`` draft tokens with ``p[s][j]``, the predicted chance
that the target accepts token ``j`` given that tokens ``< j`` were accepted (for a stage
already drafted, from its tokens' features; for one not yet drafted, an estimate). A block
of ``L`` tokens from ``s`` is expected to yield

    E_s(L) = 1 + sum_{i <= L} prod_{j <= i} p[s][j]

tokens (the target's own token always comes on top) and to cost, in one-token target
passes, ``sunk + draft_s(L) + curve(L + 1)``: what the step has spent drafting already,
what stage ``s`` still has to spend (nothing when its tokens are in hand), and the
verification pass. The programme keeps the running survival product and ``E_s(L)`` per
stage (``O(sum K_s)``) and returns the (stage, L) with the most expected tokens per unit
time; ``L = 0`` is plain decoding. Ties go to the shorter block, then the earlier stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StageOption:
    probs: Sequence[float]  # p[j], j = 0..K-1
    call_cost: float = 0.0  # one-token passes to spend before its first token (0: in hand)
    token_cost: float = 0.0  # one-token passes per token still to draft (0: in hand)


@dataclass(frozen=True)
class Choice:
    stage: int  # index into the options; -1 with length 0 (plain decoding)
    length: int
    expected_tokens: float
    cost: float  # one-token passes

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.cost


def plan(
    options: Sequence[StageOption], curve: Callable[[int], float], *, sunk: float = 0.0
) -> Choice:
    """The (stage, length) that maximises expected tokens per unit of time."""
    best = Choice(-1, 0, 1.0, sunk + curve(1))
    for s, option in enumerate(options):
        expected, survive = 1.0, 1.0
        for length, p in enumerate(option.probs, start=1):
            survive *= min(max(float(p), 0.0), 1.0)
            expected += survive
            draft = option.call_cost + option.token_cost * length
            candidate = Choice(s, length, expected, sunk + draft + curve(length + 1))
            if candidate.rate > best.rate * (1 + 1e-12):
                best = candidate
    return best
