"""The SimPy model: client sessions drafting, target servers verifying in batched passes.

One request's life: it arrives, the router sends it to a target server (where it stays),
its prompt is prefilled, then it decodes in **rounds** until its ``output_tokens`` are out:
draft ``k`` tokens, send the block, wait to ride in the server's next batched pass, keep
``accepted + 1`` tokens (the bonus token), get the verdict back. In ``distributed`` mode the
drafts are made on the client and every block crosses the link (``rtt_s / 2`` each way);
the first block travels with the prompt. In ``fused`` mode the drafter runs on the target
server: no link, and the drafting time of everyone in a pass adds to that pass.

A target server waits, once it has work, up to ``window_s`` (from the oldest waiting
block) for the batch to fill to ``max_batch`` requests or ``max_tokens_per_pass`` rows,
then runs one pass costing ``one_token_pass_s * C(rows)`` (``serving.batch.plan.PassCost``)
plus ``prefill_s_per_token`` for every prompt token that rides in it. Without
``mixed_prefill`` a prompt is prefilled in a pass of its own, ahead of any decode batch.

Events are per round and per pass, never per token: a round costs a request two SimPy
events (the link-and-draft delay, and the verdict), a pass two. Everything random
(arrivals, lengths, drafters, routing, acceptance) comes from one seed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from tasks.simulate.config import (
    Drafter,
    PoissonArrivals,
    RouterName,
    Scenario,
    TargetDevice,
    TokenCount,
)

_Process = Generator[simpy.Event, Any, None]


@dataclass(slots=True)
class Request:
    """One request's record; times in simulated seconds (``nan`` until they happen)."""

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    drafter: int
    server: int = -1
    first_token_s: float = float("nan")  # the first round's tokens reach the client
    finish_s: float = float("nan")  # the last round's tokens reach the client
    queue_wait_s: float = 0.0  # time its work waited at the server, all passes together
    rounds: int = 0
    produced: int = 0


@dataclass
class PassLog:
    """One row per target pass, as columns."""

    server: list[int] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # decode rows (pending tokens + drafts)
    requests: list[int] = field(default_factory=list)  # decode blocks and prefills in it
    prefill_tokens: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)  # blocks left waiting when it started

    def add(
        self, server: int, start: float, duration: float, rows: int, requests: int,
        prefill: int, queued: int,
    ) -> None:  # fmt: skip
        self.server.append(server)
        self.start_s.append(start)
        self.duration_s.append(duration)
        self.rows.append(rows)
        self.requests.append(requests)
        self.prefill_tokens.append(prefill)
        self.queued.append(queued)


@dataclass(frozen=True)
class ServerInfo:
    name: str  # device name and replica, e.g. "cpu#0"
    max_batch: int
    max_tokens_per_pass: int


@dataclass
class SimLog:
    """Everything a run recorded; :mod:`tasks.simulate.report` turns it into figures."""

    servers: list[ServerInfo]
    requests: list[Request]
    passes: PassLog
    duration_s: float  # the arrival window the rates are over
    end_s: float  # where the simulated clock stopped
    tokens_in_window: int  # output tokens that reached clients by duration_s
    slo_s: float
    queue_bin_s: float


@dataclass(slots=True)
class _Work:
    request: Request
    rows: int  # 1 + k for a decode block; 0 for a prefill
    prefill_tokens: int
    draft_s: float  # fused mode: drafting done on the server, inside the pass
    submitted_s: float
    done: simpy.Event


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


class TargetServer:
    """One target replica: a FIFO of decode blocks (and prefills), served in batched passes."""

    def __init__(
        self, env: simpy.Environment, index: int, device: TargetDevice, window_s: float,
        mixed_prefill: bool, passes: PassLog,
    ) -> None:  # fmt: skip
        self.env, self.index, self.device = env, index, device
        self.window_s, self.mixed_prefill, self.passes = window_s, mixed_prefill, passes
        self.max_batch, self.max_rows = device.max_batch, device.max_tokens_per_pass
        cost = device.pass_cost()
        # seconds of a pass over n decode rows, n = 0 .. max_tokens_per_pass
        self.pass_s = [0.0] + [device.pass_s * cost(n) for n in range(1, self.max_rows + 1)]
        self.waiting: deque[_Work] = deque()
        self.prefills: deque[_Work] = deque()  # without mixed_prefill: passes of their own
        self.waiting_rows = 0
        self._wake: simpy.Event | None = None
        self._full: simpy.Event | None = None
        env.process(self._serve())

    def submit(self, work: _Work) -> None:
        if work.rows == 0 and not self.mixed_prefill:
            self.prefills.append(work)
        else:
            self.waiting.append(work)
            self.waiting_rows += work.rows
            if self._full is not None and self._is_full():
                self._full.succeed()
                self._full = None
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def _is_full(self) -> bool:
        return len(self.waiting) >= self.max_batch or self.waiting_rows >= self.max_rows

    def _serve(self) -> _Process:
        env = self.env
        while True:
            if not self.waiting and not self.prefills:
                self._wake = env.event()
                yield self._wake
            if self.prefills:
                work = self.prefills.popleft()
                yield from self._run([work], rows=0, prefill=work.prefill_tokens, draft_s=0.0)
                continue
            wait = self.waiting[0].submitted_s + self.window_s - env.now
            if wait > 0 and not self._is_full():
                self._full = env.event()
                yield self._full | env.timeout(wait)
                self._full = None
            batch, rows, prefill, draft_s = self._take()
            yield from self._run(batch, rows=rows, prefill=prefill, draft_s=draft_s)

    def _take(self) -> tuple[list[_Work], int, int, float]:
        """The oldest blocks that fit one pass (FIFO: a block that does not fit waits)."""
        batch: list[_Work] = []
        rows = prefill = 0
        draft_s = 0.0
        waiting = self.waiting
        while waiting and len(batch) < self.max_batch:
            head = waiting[0]
            if rows + head.rows > self.max_rows:
                break
            waiting.popleft()
            batch.append(head)
            rows += head.rows
            prefill += head.prefill_tokens
            draft_s += head.draft_s
        self.waiting_rows -= rows
        return batch, rows, prefill, draft_s

    def _run(self, batch: list[_Work], *, rows: int, prefill: int, draft_s: float) -> _Process:
        env = self.env
        now = env.now
        duration = self.pass_s[rows] + prefill * self.device.prefill_s_per_token + draft_s
        for work in batch:
            work.request.queue_wait_s += now - work.submitted_s
        self.passes.add(self.index, now, duration, rows, len(batch), prefill, len(self.waiting))
        if duration > 0:
            yield env.timeout(duration)
        for work in batch:
            work.done.succeed()
        # let the requests just served run first: a block sent back at once (fused, or no
        # link) rides in the very next pass, as in continuous batching
        yield env.timeout(0)


class Simulation:
    """One scenario, built once and run with :meth:`run`."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.env = simpy.Environment()
        streams = np.random.SeedSequence(scenario.seed).spawn(4)
        self._arrival_rng, router_rng, accept_rng, self._length_rng = (
            np.random.default_rng(s) for s in streams
        )
        self.passes = PassLog()
        self.servers: list[TargetServer] = []
        self.infos: list[ServerInfo] = []
        for device in scenario.targets:
            for replica in range(device.count):
                self.servers.append(
                    TargetServer(
                        self.env,
                        len(self.servers),
                        device,
                        scenario.batching.window_s,
                        scenario.batching.mixed_prefill,
                        self.passes,
                    )
                )
                self.infos.append(
                    ServerInfo(
                        f"{device.name}#{replica}", device.max_batch, device.max_tokens_per_pass
                    )
                )
        self.router = Router(scenario.router, [s.device.pass_s for s in self.servers], router_rng)
        uniforms = Uniforms(accept_rng)
        self.acceptance = [
            Acceptance(d.acceptance_by_position, uniforms) for d in scenario.drafters
        ]
        self.requests: list[Request] = []
        self.tokens_in_window = 0
        self._active = [0] * len(self.servers)
        self._outstanding = 0  # requests arrived and not finished
        self._arrived_all = False
        self._all_done = self.env.event()

    def run(self) -> SimLog:
        scenario = self.scenario
        env = self.env
        env.process(self._arrivals())
        # stop when every request has finished, or at the end of the drain at the latest
        env.run(
            until=env.any_of([self._all_done, env.timeout(scenario.duration_s + scenario.drain_s)])
        )
        return SimLog(
            servers=self.infos,
            requests=self.requests,
            passes=self.passes,
            duration_s=scenario.duration_s,
            end_s=float(self.env.now),
            tokens_in_window=self.tokens_in_window,
            slo_s=scenario.slo_s,
            queue_bin_s=scenario.queue_bin_s,
        )

    def arrival_times(self) -> list[float]:
        """When requests arrive, within ``[0, duration_s)`` and up to ``max_requests``."""
        arrivals, end = self.scenario.arrivals, self.scenario.duration_s
        cap = arrivals.max_requests or 1 << 62
        if not isinstance(arrivals, PoissonArrivals):
            return [t for t in arrivals.timestamps if t < end][:cap]
        times: list[float] = []
        now = 0.0
        expected = int(arrivals.rate_per_s * end * 1.2) + 64
        while len(times) < cap:
            gaps = self._arrival_rng.exponential(1.0 / arrivals.rate_per_s, expected)
            for at in (now + np.cumsum(gaps)).tolist():
                if at >= end or len(times) >= cap:
                    return times
                times.append(at)
            now = times[-1]
        return times

    def _lengths(self, spec: TokenCount, count: int) -> list[int]:
        if isinstance(spec, int):
            return [spec] * count
        return [int(v) for v in self._length_rng.choice(spec, size=count)]

    def _arrivals(self) -> _Process:
        scenario, env = self.scenario, self.env
        times = self.arrival_times()
        prompts = self._lengths(scenario.arrivals.prompt_tokens, len(times))
        outputs = self._lengths(scenario.arrivals.output_tokens, len(times))
        shares = np.array([d.share for d in scenario.drafters])
        drafters = self._length_rng.choice(len(shares), size=len(times), p=shares / shares.sum())
        for index, at in enumerate(times):
            if at > env.now:
                yield env.timeout(at - env.now)
            request = Request(index, at, prompts[index], outputs[index], int(drafters[index]))
            self.requests.append(request)
            self._outstanding += 1
            env.process(self._session(request))
        self._arrived_all = True
        self._check_done()

    def _check_done(self) -> None:
        if self._arrived_all and self._outstanding == 0 and not self._all_done.triggered:
            self._all_done.succeed()

    def _session(self, request: Request) -> _Process:
        env, scenario = self.env, self.scenario
        drafter: Drafter = scenario.drafters[request.drafter]
        acceptance = self.acceptance[request.drafter]
        chosen = self.router.pick(self._active)
        self._active[chosen] += 1
        server = self.servers[chosen]
        request.server = chosen
        distributed = scenario.mode == "distributed"
        half_rtt = scenario.link.rtt_s / 2 if distributed else 0.0
        draft_s = drafter.draft_s_per_token
        remaining = request.output_tokens
        k = min(drafter.k, remaining - 1)
        # distributed: the first block is drafted on the client and travels with the prompt
        lead = k * draft_s + half_rtt if distributed else 0.0
        if lead > 0:
            yield env.timeout(lead)
        if request.prompt_tokens > 0:
            done = env.event()
            server.submit(_Work(request, 0, request.prompt_tokens, 0.0, env.now, done))
            yield done
        while True:
            done = env.event()
            server_draft_s = 0.0 if distributed else k * draft_s
            server.submit(_Work(request, 1 + k, 0, server_draft_s, env.now, done))
            yield done
            tokens = acceptance.sample(k) + 1  # the bonus token; k <= remaining - 1
            remaining -= tokens
            request.rounds += 1
            request.produced += tokens
            delivered = env.now + half_rtt
            if request.rounds == 1:
                request.first_token_s = delivered
            if delivered <= scenario.duration_s:
                self.tokens_in_window += tokens
            if remaining == 0:
                request.finish_s = delivered
                break
            k = min(drafter.k, remaining - 1)
            gap = 2 * half_rtt + k * draft_s if distributed else 0.0
            if gap > 0:
                yield env.timeout(gap)
        self._active[chosen] -= 1
        self._outstanding -= 1
        self._check_done()


def simulate(scenario: Scenario) -> SimLog:
    """Run ``scenario`` once (deterministic for its seed) and return what it recorded."""
    return Simulation(scenario).run()
