"""Draft lengths for a batch: what a draft token costs when it rides in a shared pass.

Alone, the cost-aware policy (:class:`serving.engine.policy.CostAwareK`) picks the k that
maximises its own tokens per second, ``E(k) / (k·t_draft + C(k + 1))``. In a batch the pass
is shared: ``B`` requests with blocks of ``1 + k_i`` rows pay one pass of
``C(sum(1 + k_i))`` rows plus every request's drafting, and yield ``sum E_i(k_i)`` tokens.
:func:`plan_batch` maximises that batch throughput greedily: from no drafts, it keeps
lengthening the one block that raises the batch's tokens per second most, and stops when
none does. A draft token is then worth its row of a larger pass only if it is likelier to
be kept than the batch's tokens per row: on a flat curve requests draft long, where rows
cost as much as passes nobody drafts. Requests on other policies keep their own k (the
batch still prices them in, at their running acceptance), as does a cost-aware policy's
probe.

``C(n)``, the cost of a packed pass over ``n`` rows relative to a one-token pass, comes
from the hardware target's measured ``batch_curve`` (``specops profile --batch``), or,
where none was measured, from its single-sequence ``verify_curve`` extended at its average
slope. Finally the blocks are cut, longest first, to the pass's token budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from serving.curves import PassCost
from serving.engine.policy import CostAwareK
from serving.errors import BadInputError


def _running_expectation(accepted: int, drafted: int, k: int) -> float:
    """``E(k)`` at a request's running acceptance rate (Laplace-smoothed)."""
    rate = (accepted + 1) / (drafted + 2)
    return 1.0 + sum(rate**i for i in range(1, k + 1))


@dataclass
class Member:
    """What the planner needs of one request in the batch."""

    k: int  # its own (solo) choice
    cap: int  # the most it may draft (its budget, its policy's k_max)
    policy: CostAwareK | None  # None: not cost-aware, keeps k
    accepted: int = 0  # running counts, to price non-cost-aware members
    drafted: int = 0

    def expected(self) -> list[float]:
        """``E(k)`` for k = 0..cap (and the own k, for members that keep it)."""
        top = max(self.cap, self.k)
        if self.policy is not None:
            row = self.policy.expected_tokens()
            return [row[min(k, self.policy.k_max)] for k in range(top + 1)]
        return [_running_expectation(self.accepted, self.drafted, k) for k in range(top + 1)]

    def draft_cost(self) -> float:
        return self.policy.draft_cost() if self.policy is not None else 0.0


def plan_batch(members: Sequence[Member], cost: PassCost, *, budget: int) -> list[int]:
    """Each member's k for one packed pass of at most ``budget`` rows (``budget >=
    len(members)``: every request's pending token always rides)."""
    if budget < len(members):
        raise BadInputError(
            f"a pass of {budget} tokens cannot carry {len(members)} requests' pending tokens"
        )
    if len(members) == 1:  # alone: the policy's own choice
        ks = [max(0, min(members[0].k, members[0].cap))]
    else:
        ks = _ascend(members, cost, budget)
    while sum(1 + k for k in ks) > budget:
        longest = max(range(len(ks)), key=lambda i: ks[i])
        ks[longest] -= 1
    return ks


def _ascend(members: Sequence[Member], cost: PassCost, budget: int) -> list[int]:
    """Cost-aware members start at k = 0 and, while it raises the batch's tokens per second,
    the one move that raises it most is taken: one member's k up to any longer block (a
    jump, not a step, so a curve with a step in it does not stop the climb early)."""
    ks = [0 if m.policy is not None else max(0, min(m.k, m.cap)) for m in members]
    expected = [m.expected() for m in members]
    draft_costs = [m.draft_cost() for m in members]

    def rate(tokens: float, drafting: float, rows: int) -> float:
        return tokens / (drafting + cost(rows))

    tokens = sum(expected[i][k] for i, k in enumerate(ks))
    drafting = sum(draft_costs[i] * k for i, k in enumerate(ks))
    rows = sum(1 + k for k in ks)
    current = rate(tokens, drafting, rows)
    while rows < budget:
        best: tuple[float, int, int] | None = None
        for i, member in enumerate(members):
            if member.policy is None:
                continue
            for k in range(ks[i] + 1, min(member.cap, ks[i] + budget - rows) + 1):
                gain = rate(
                    tokens + expected[i][k] - expected[i][ks[i]],
                    drafting + draft_costs[i] * (k - ks[i]),
                    rows + k - ks[i],
                )
                if best is None or gain > best[0]:
                    best = (gain, i, k)
        if best is None or best[0] <= current:
            break
        current, i, k = best
        tokens += expected[i][k] - expected[i][ks[i]]
        drafting += draft_costs[i] * (k - ks[i])
        rows += k - ks[i]
        ks[i] = k
    return ks
