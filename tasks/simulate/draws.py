"""The simulation's seeded random choices: uniform draws fetched in blocks, the drafts a
round accepts, the target server a new session is routed to, and open-loop arrival times."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tasks.simulate.config import PoissonArrivals, RouterName, TraceArrivals


class Uniforms:
    """Uniform draws from a seeded Generator, fetched in blocks (one numpy call per 64k)."""

    def __init__(self, rng: np.random.Generator, block: int = 65536) -> None:
        self._rng, self._block = rng, block
        self._buffer: list[float] = []
        self._next = 0

    def __call__(self) -> float:
        if self._next == len(self._buffer):
            self._buffer, self._next = self._rng.random(self._block).tolist(), 0
        value = self._buffer[self._next]
        self._next += 1
        return value


class Acceptance:
    """Accepted drafts per round: draft i is kept with ``acceptance_by_position[i]`` given
    drafts ``0..i-1`` were. One uniform ``u`` per round: the accepted length is the number
    of positions whose survival ``prod(p[:j])`` exceeds ``u`` (survival never rises)."""

    def __init__(self, acceptance_by_position: Sequence[float], uniforms: Uniforms) -> None:
        self.survival = [float(s) for s in np.cumprod([1.0, *acceptance_by_position])]
        self._uniforms = uniforms

    def sample(self, k: int) -> int:
        u = self._uniforms()
        survival, accepted = self.survival, 0
        while accepted < k and u < survival[accepted + 1]:
            accepted += 1
        return accepted


class Router:
    """Picks a target server for a new session from the servers' active sessions.

    ``round_robin`` cycles; ``jsq2`` samples two distinct servers and takes the one with
    fewer active sessions (the first on a tie); ``weighted_jsq2`` compares
    ``(sessions + 1) * one_token_pass_s`` instead, the new session's share of a slower
    device counting for more."""

    def __init__(self, name: RouterName, pass_s: Sequence[float], rng: np.random.Generator):
        self.name, self._pass_s, self._rng = name, list(pass_s), rng
        self._next = 0

    def pick(self, active: Sequence[int]) -> int:
        count = len(active)
        if self.name == "round_robin":
            chosen = self._next % count
            self._next += 1
            return chosen
        if count == 1:
            return 0
        first = int(self._rng.integers(count))
        second = int(self._rng.integers(count - 1))
        second += second >= first  # distinct from the first
        if self.name == "jsq2":
            return first if active[first] <= active[second] else second
        weigh = self._pass_s
        first_load = (active[first] + 1) * weigh[first]
        return first if first_load <= (active[second] + 1) * weigh[second] else second


def open_arrival_times(
    arrivals: PoissonArrivals | TraceArrivals, end: float, rng: np.random.Generator
) -> list[float]:
    """When open-loop requests arrive, within ``[0, end)`` and up to ``max_requests``: a
    trace's timestamps, or Poisson arrivals drawn from ``rng``."""
    cap = arrivals.max_requests or 1 << 62
    if not isinstance(arrivals, PoissonArrivals):
        return [t for t in arrivals.timestamps if t < end][:cap]
    times: list[float] = []
    now = 0.0
    expected = int(arrivals.rate_per_s * end * 1.2) + 64
    while len(times) < cap:
        gaps = rng.exponential(1.0 / arrivals.rate_per_s, expected)
        for at in (now + np.cumsum(gaps)).tolist():
            if at >= end or len(times) >= cap:
                return times
            times.append(at)
        now = times[-1]
    return times
