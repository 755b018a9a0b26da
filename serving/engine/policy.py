"""Draft-length policies: how many tokens to draft in the next step.

A policy sees what each step proposed and kept, and how long drafting and verifying took.
``FixedK`` always asks for k; ``AdaptiveK`` is Hugging Face's "heuristic" schedule (+2 after
a fully accepted block, -1 otherwise, within [1, k_max]); ``CostAwareK`` picks the k that
maximises expected tokens per second from measured acceptance and measured costs, and
stops drafting (k = 0) when no k pays. Learned policies (the predictor issue) implement the
same methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal, get_args

from serving.curves import DEFAULT_VERIFY_CURVE, curve_cost, normalise_curve
from serving.errors import BadInputError

# The draft-length policies by name, declared once: configs and request bodies type their
# field with PolicyName, everything else checks against POLICIES (check_policy).
PolicyName = Literal["fixed", "adaptive", "cost"]
POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)

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
    def update(
        self, proposed: int, accepted: int, *, draft_s: float = 0.0, verify_s: float = 0.0
    ) -> None:
        """Learn from the step just verified (its timings are optional)."""

    def describe(self) -> dict[str, object]:
        return {"name": self.name}


class FixedK(DraftLengthPolicy):
    def __init__(self, k: int) -> None:
        self.k = check_k(k)
        self.name = f"fixed(k={k})"

    def next_k(self) -> int:
        return self.k

    def update(
        self, proposed: int, accepted: int, *, draft_s: float = 0.0, verify_s: float = 0.0
    ) -> None:
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

    def update(
        self, proposed: int, accepted: int, *, draft_s: float = 0.0, verify_s: float = 0.0
    ) -> None:
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

    def update(
        self, proposed: int, accepted: int, *, draft_s: float = 0.0, verify_s: float = 0.0
    ) -> None:
        return None


class CostAwareK(DraftLengthPolicy):
    """Pick k to maximise expected tokens per second; draft nothing when nothing pays.

    With ``alpha[j]`` the chance that draft j is kept given drafts before it were kept,
    a block of k drafts yields ``E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha[j]`` tokens and costs
    ``C(k) = k * t_draft + t_verify(k + 1)``; the policy returns ``argmax_k E(k) / C(k)``
    over ``0..k_max`` (``E(0) / C(0) = 1 / t_verify(1)``, plain decoding).

    ``alpha`` comes from per-position kept/rejected counts that decay by ``decay`` each step
    (so it follows the request's regime, e.g. copying vs. free text) on top of a Beta prior
    that carries over between requests. ``t_draft`` (per drafted token) and the scale of
    ``t_verify`` are moving averages of the step's measured times; ``t_verify(n)`` follows
    ``verify_curve``. When k = 0 wins ``probe_every`` times in a row, one token is drafted
    to keep the estimates current. Greedy output is unaffected by k; under sampling the
    exact tokens drawn for a seed depend on the k chosen (timings), the distribution does
    not - use ``fixed`` for bit-reproducible sampling.

    ``draft_cost`` (one drafted token, in one-token target passes; also settable later with
    :meth:`use_profiled_draft_cost`) replaces the measured ratio: the k chosen then depends
    only on what was accepted, so a greedy request's steps are the same on any machine and
    under any load (what the evaluation's modelled speed needs, :mod:`tasks.evaluate.costs`).
    """

    def __init__(
        self,
        k_max: int = 8,
        *,
        verify_curve: tuple[float, ...] = DEFAULT_VERIFY_CURVE,
        prior_accept: float = 0.5,
        prior_strength: float = 2.0,
        decay: float = 0.8,
        probe_every: int = 16,
        smoothing: float = 0.2,
        draft_cost: float | None = None,
    ) -> None:
        self.k_max = check_k(k_max, name="k_max")
        if not 0.0 < prior_accept < 1.0:
            raise BadInputError(f"prior_accept must be in (0, 1), got {prior_accept!r}")
        if not 0.0 < decay <= 1.0:
            raise BadInputError(f"decay must be in (0, 1], got {decay!r}")
        self.verify_curve = normalise_curve(verify_curve)
        self.prior_accept = prior_accept
        self.prior_strength = prior_strength
        self.decay = decay
        self.probe_every = probe_every
        self.smoothing = smoothing
        self.name = f"cost(k_max={k_max})"
        # Long-run prior (kept across requests) and this request's decayed evidence.
        self._prior = [prior_accept] * self.k_max
        self._kept = [0.0] * self.k_max
        self._seen = [0.0] * self.k_max
        self._t_unit: float | None = None  # seconds of a one-token target pass
        self._t_draft: float | None = None  # seconds per drafted token
        self._idle = 0
        self.profiled_draft_cost: float | None = None
        if draft_cost is not None:
            self.use_profiled_draft_cost(draft_cost)

    def use_profiled_draft_cost(self, cost: float) -> None:
        """Price drafting at ``cost`` one-token target passes per drafted token from now on,
        instead of the step times measured while decoding."""
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not cost >= 0:
            raise BadInputError(f"draft_cost must be a number >= 0, got {cost!r}")
        self.profiled_draft_cost = float(cost)

    def begin(self) -> None:
        self._kept = [0.0] * self.k_max
        self._seen = [0.0] * self.k_max
        self._idle = 0

    def curve(self, n: int) -> float:
        return curve_cost(self.verify_curve, n)

    def alpha(self, position: int) -> float:
        prior = self._prior[position] * self.prior_strength
        return (prior + self._kept[position]) / (self.prior_strength + self._seen[position])

    def expected_tokens(self) -> list[float]:
        """``E(k)`` for k = 0..k_max: tokens a step yields with k drafts (the target's own
        included)."""
        expected, survive = [1.0], 1.0
        for k in range(1, self.k_max + 1):
            survive *= self.alpha(k - 1)
            expected.append(expected[-1] + survive)
        return expected

    def draft_cost(self) -> float:
        """Seconds per drafted token, in one-token target passes (the profiled cost where
        one was given)."""
        if self.profiled_draft_cost is not None:
            return self.profiled_draft_cost
        return (self._t_draft or 0.0) / (self._t_unit or 1.0)

    def rates(self) -> list[float]:
        """``E(k) / C(k)`` for k = 0..k_max, in tokens per one-token-pass time, one pass."""
        t_draft = self.draft_cost()
        return [
            expected / (k * t_draft + self.curve(k + 1))
            for k, expected in enumerate(self.expected_tokens())
        ]

    def expected_rate(self, k: int) -> float:
        return self.rates()[k]

    def next_k(self) -> int:
        rates = self.rates()
        best_k = max(range(len(rates)), key=lambda k: (rates[k], -k))  # ties: the shorter
        if best_k == 0:
            self._idle += 1
            if self._idle >= self.probe_every:
                self._idle = 0
                return 1
        else:
            self._idle = 0
        return best_k

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def update(
        self, proposed: int, accepted: int, *, draft_s: float = 0.0, verify_s: float = 0.0
    ) -> None:
        if verify_s > 0:
            self._t_unit = self._average(self._t_unit, verify_s / self.curve(proposed + 1))
        if proposed > 0 and draft_s > 0:
            self._t_draft = self._average(self._t_draft, draft_s / proposed)
        for position in range(self.k_max):
            self._kept[position] *= self.decay
            self._seen[position] *= self.decay
        for position in range(min(proposed, accepted + 1, self.k_max)):
            kept = position < accepted
            self._kept[position] += kept
            self._seen[position] += 1.0
            # The long-run prior moves slowly toward what this drafter achieves.
            self._prior[position] += 0.02 * (kept - self._prior[position])

    def describe(self) -> dict[str, object]:
        return {
            "name": "cost",
            "k_max": self.k_max,
            "decay": self.decay,
            "prior_strength": self.prior_strength,
            "probe_every": self.probe_every,
        }


def check_policy(name: object) -> PolicyName:
    """``name`` if it names a policy; :class:`BadInputError` listing them otherwise."""
    for policy in POLICIES:
        if name == policy:
            return policy
    raise BadInputError(f"unknown policy {name!r}; choose one of {POLICIES}")


def make_policy(
    name: str, k: int, *, verify_curve: tuple[float, ...] | None = None
) -> DraftLengthPolicy:
    """``k`` is the fixed k, the adaptive start, or the cost policy's largest k;
    ``verify_curve`` is the hardware target's measured pass-cost curve (cost policy only)."""
    check_k(k)
    policy = check_policy(name)
    if policy == "fixed":
        return FixedK(k)
    if policy == "adaptive":
        return AdaptiveK(k)
    return CostAwareK(k_max=k, verify_curve=verify_curve or DEFAULT_VERIFY_CURVE)
