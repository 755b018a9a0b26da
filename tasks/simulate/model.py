"""The SimPy model: client sessions drafting, target servers verifying in batched passes.

One request's life: it arrives, the router sends it to a target server (where it stays),
its prompt is prefilled, then it decodes in **rounds** until its ``output_tokens`` are out:
draft ``k`` tokens, send the block, wait to ride in the server's next batched pass, keep
``accepted + 1`` tokens (the bonus token), get the verdict back. In ``distributed`` mode the
drafts are made on the client and every block crosses the link (``rtt_s / 2`` each way);
the first block travels with the prompt. In ``fused`` mode the drafter runs on the target
server: no link, and the drafting time of everyone in a pass adds to that pass.

A target server waits, once it has work, up to ``window_s`` (from the oldest waiting
block; with ``wait_for: sessions`` from when it is free, and for its sessions' blocks) for
the batch to fill to ``max_batch`` requests or ``max_tokens_per_pass`` rows, then runs one
pass priced by its rows and requests (``TargetDevice.pass_grid``: the profile's table, or
``one_token_pass_s * C(rows)``) plus the prefill of every prompt token that rides in it
(``TargetDevice.prefill_s``). Without
``mixed_prefill`` a prompt is prefilled in a pass of its own, ahead of any decode batch.

Requests arrive from a Poisson process, a trace, or closed-loop clients (each sends its
next request ``think_s`` after its previous answer came back).

Events are per pass, never per token or per round: sessions and servers are callbacks on
SimPy timeouts, not processes. A pass costs its server one timeout for its duration and one
zero-delay timeout to pick the next batch (so that everything due at that instant is in
the queue first); the sessions it served go back to the server after their link-and-draft
gap in **one** timeout per distinct gap (every session of a drafter has the same gap but
the last round's), not one each. Everything random (arrivals, lengths, drafters, routing,
acceptance) comes from one seed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import simpy
from simpy.events import Timeout

from tasks.simulate.config import (
    ClosedArrivals,
    Drafter,
    Scenario,
    TargetDevice,
    TokenCount,
    TraceArrivals,
)
from tasks.simulate.draws import Acceptance, Router, Uniforms, open_arrival_times
from tasks.simulate.records import PassLog, Request, ServerInfo, SimLog

_Process = Generator[simpy.Event, Any, None]


@dataclass(slots=True, eq=False)
class _Session:
    """A request in flight, and the work it has at its server (a prefill, or a block)."""

    request: Request
    drafter: Drafter
    acceptance: Acceptance
    server: TargetServer
    remaining: int  # output tokens still to produce
    k: int  # drafts in the current block
    rows: int = 0  # 1 + k for a decode block; 0 for a prefill
    prefill_tokens: int = 0  # > 0 while the work is the prompt's prefill
    draft_s: float = 0.0  # fused mode: drafting done on the server, inside the pass
    submitted_s: float = 0.0


def _after(
    env: simpy.Environment, delay: float, callback: Callable[[Any], None], value: Any
) -> None:
    """Call ``callback(value)`` ``delay`` simulated seconds from now (one SimPy event)."""
    Timeout(env, delay, (callback, value)).callbacks.append(_fire)


def _fire(event: simpy.Event) -> None:
    callback, value = cast(tuple[Callable[[Any], None], Any], event.value)
    callback(value)


class TargetServer:
    """One target replica: a FIFO of decode blocks (and prefills), served in batched passes.

    Idle, it picks a batch at the instant work arrives (a zero-delay event, so that all
    work due then is in); with ``window_s`` it then waits for the oldest block's window to
    close or the batch to fill. A finished pass hands its sessions to ``on_pass`` and picks
    the next batch at the same instant, after everything already due then (a block sent
    back at once, fused or with no link, rides in the very next pass, as in continuous
    batching)."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        device: TargetDevice,
        window_s: float,
        mixed_prefill: bool,
        passes: PassLog,
        on_pass: Callable[[list[_Session]], None],
        wait_for: str = "fill",
        pass_grid: list[list[float]] | None = None,
    ) -> None:
        self.env, self.index, self.device = env, index, device
        self.window_s, self.mixed_prefill, self.passes = window_s, mixed_prefill, passes
        self.wait_for_sessions = wait_for == "sessions"
        self.decoding = 0  # sessions prefilled here and not finished (wait_for "sessions")
        self._pass_ewma: float | None = None  # decode passes' duration, a moving average
        self.max_batch, self.max_rows = device.max_batch, device.max_tokens_per_pass
        # seconds of a pass over n decode rows of s requests: pass_grid[s][n]
        self.pass_grid = pass_grid or device.pass_grid()
        self.waiting: deque[_Session] = deque()
        self.prefills: deque[_Session] = deque()  # without mixed_prefill: passes of their own
        self.waiting_rows = 0
        self._on_pass = on_pass
        self._batch: list[_Session] | None = None  # the pass running, if any
        self._picking = False  # a zero-delay pick is scheduled
        self._window = 0  # > 0: waiting for the window whose timer carries this number
        self._windows = 0
        self._filled = False  # a window's batch filled: take it at the scheduled pick

    def submit(self, work: _Session) -> None:
        if work.rows == 0 and not self.mixed_prefill:
            self.prefills.append(work)
        else:
            self.waiting.append(work)
            self.waiting_rows += work.rows
            if self._window and self._is_full():
                # the batch filled before its window closed: it goes next, even if a
                # prefill came meanwhile (as when the window closes)
                self._window, self._filled = 0, True
                self._schedule_pick()
                return
        if self._batch is None and not self._window:
            self._schedule_pick()

    def _is_full(self) -> bool:
        if self.wait_for_sessions and len(self.waiting) >= min(self.decoding, self.max_batch):
            return True  # every session decoding here has its block in
        return len(self.waiting) >= self.max_batch or self.waiting_rows >= self.max_rows

    def _schedule_pick(self) -> None:
        if not self._picking:
            self._picking = True
            Timeout(self.env, 0.0).callbacks.append(self._pick)

    def _pick(self, _event: object) -> None:
        self._picking = False
        if self._batch is not None or self._window:
            return
        if self._filled:
            self._filled = False
            self._run(*self._take())
            return
        if self.prefills:
            work = self.prefills.popleft()
            self._run([work], rows=0, prefill=work.prefill_tokens, draft_s=0.0)
            return
        if not self.waiting:
            return
        if self.wait_for_sessions:  # from now: the server has just become free
            # at most half a pass, as the target server (serving/distributed/scheduler.py)
            ewma = self._pass_ewma
            wait = self.window_s if ewma is None else min(self.window_s, ewma / 2)
        else:
            wait = self.waiting[0].submitted_s + self.window_s - self.env.now
        if wait > 0 and not self._is_full():
            self._windows += 1
            self._window = self._windows
            _after(self.env, wait, self._window_closed, self._window)
            return
        self._run(*self._take())

    def _window_closed(self, window: int) -> None:
        if window == self._window:  # else the batch filled first and has gone
            self._window = 0
            self._run(*self._take())

    def _take(self) -> tuple[list[_Session], int, int, float]:
        """The oldest blocks that fit one pass (FIFO: a block that does not fit waits)."""
        batch: list[_Session] = []
        rows = prefill = 0
        draft_s = 0.0
        waiting, max_batch, max_rows = self.waiting, self.max_batch, self.max_rows
        while waiting and len(batch) < max_batch:
            head = waiting[0]
            if rows + head.rows > max_rows:
                break
            waiting.popleft()
            batch.append(head)
            rows += head.rows
            prefill += head.prefill_tokens
            draft_s += head.draft_s
        self.waiting_rows -= rows
        return batch, rows, prefill, draft_s

    def _run(self, batch: list[_Session], rows: int, prefill: int, draft_s: float) -> None:
        now = self.env.now
        sequences = sum(1 for work in batch if work.rows)
        duration = self.pass_grid[sequences][rows] + self.device.prefill_s(prefill) + draft_s
        for work in batch:
            work.request.queue_wait_s += now - work.submitted_s
        self.passes.add(self.index, now, duration, rows, len(batch), prefill, len(self.waiting))
        if rows:
            ewma = self._pass_ewma
            self._pass_ewma = duration if ewma is None else 0.7 * ewma + 0.3 * duration
        self._batch = batch
        if duration > 0:
            Timeout(self.env, duration).callbacks.append(self._finish)
        else:
            self._finish(None)

    def _finish(self, _event: object) -> None:
        batch, self._batch = self._batch, None
        assert batch is not None
        self._on_pass(batch)
        self._schedule_pick()


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
            grid = device.pass_grid()  # once per kind of device, shared by its replicas
            for replica in range(device.count):
                self.servers.append(
                    TargetServer(
                        self.env,
                        len(self.servers),
                        device,
                        scenario.batching.window_s,
                        scenario.batching.mixed_prefill,
                        self.passes,
                        self._pass_done,
                        scenario.batching.wait_for,
                        grid,
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
        # Per drafter: the cumulative block-length shares (None: always k drafts).
        self._block_cdf = [
            None
            if d.block_shares is None
            else [float(c) for c in np.cumsum(d.block_shares) / sum(d.block_shares)]
            for d in scenario.drafters
        ]
        self._block_draw = Uniforms(np.random.default_rng(streams[0].spawn(1)[0]), block=4096)
        self.requests: list[Request] = []
        self.tokens_in_window = 0
        self._distributed = scenario.mode == "distributed"
        self._half_rtt = scenario.link.rtt_s / 2 if self._distributed else 0.0
        self._active = [0] * len(self.servers)
        self._outstanding = 0  # requests arrived and not finished
        self._sources = 0  # arrival sources (the open process, or clients) still sending
        self._all_done = self.env.event()

    def run(self) -> SimLog:
        scenario = self.scenario
        env = self.env
        if isinstance(scenario.arrivals, ClosedArrivals):
            self._start_clients(scenario.arrivals)
        else:
            self._sources = 1
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

    # --- arrivals ---------------------------------------------------------------------
    def arrival_times(self) -> list[float]:
        """When open-loop requests arrive, within ``[0, duration_s)`` and up to
        ``max_requests`` (closed-loop clients send as their answers come back)."""
        arrivals = self.scenario.arrivals
        if isinstance(arrivals, ClosedArrivals):
            raise TypeError("closed-loop clients have no arrival times before the run")
        return open_arrival_times(arrivals, self.scenario.duration_s, self._arrival_rng)

    def _block(self, drafter: int, remaining: int) -> int:
        """A round's draft length: ``k`` or a draw from ``block_shares``; never past the
        budget (the target's own token always comes on top)."""
        cdf = self._block_cdf[drafter]
        k = self.scenario.drafters[drafter].k
        if cdf is not None:
            u = self._block_draw()
            k = next((j for j, c in enumerate(cdf) if u < c), len(cdf) - 1)
        return max(0, min(k, remaining - 1))

    def _lengths(self, spec: TokenCount, count: int, in_order: bool = False) -> list[int]:
        if isinstance(spec, int):
            return [spec] * count
        if in_order:  # a trace's per-request lengths (validated: one per timestamp)
            return [int(v) for v in spec[:count]]
        return [int(v) for v in self._length_rng.choice(spec, size=count)]

    def _drafter_picks(self, count: int) -> list[int]:
        shares = np.array([d.share for d in self.scenario.drafters])
        picks = self._length_rng.choice(len(shares), size=count, p=shares / shares.sum())
        return [int(p) for p in picks]

    def _arrivals(self) -> _Process:
        arrivals, env = self.scenario.arrivals, self.env
        assert not isinstance(arrivals, ClosedArrivals)
        times = self.arrival_times()
        in_order = isinstance(arrivals, TraceArrivals) and arrivals.lengths == "per_request"
        prompts = self._lengths(arrivals.prompt_tokens, len(times), in_order)
        outputs = self._lengths(arrivals.output_tokens, len(times), in_order)
        drafters = self._drafter_picks(len(times))
        for index, at in enumerate(times):
            if at > env.now:
                yield env.timeout(at - env.now)
            self._arrive(Request(index, at, prompts[index], outputs[index], drafters[index]))
        self._source_done()

    def _start_clients(self, arrivals: ClosedArrivals) -> None:
        """Each client draws its drafter once (a draft device has one) and sends its first
        request at ``i * ramp_s / clients``; lengths are drawn per request."""
        self._sources = arrivals.clients
        self._client_drafter = self._drafter_picks(arrivals.clients)
        self._client_sent = [0] * arrivals.clients
        self._length_draw = Uniforms(self._length_rng, block=4096)
        for client in range(arrivals.clients):
            _after(self.env, client * arrivals.ramp_s / arrivals.clients, self._send, client)

    def _draw(self, spec: TokenCount) -> int:
        if isinstance(spec, int):
            return spec
        return int(spec[int(self._length_draw() * len(spec))])

    def _send(self, client: int) -> None:
        """Closed loop: ``client`` sends its next request, or stops for good."""
        arrivals = self.scenario.arrivals
        assert isinstance(arrivals, ClosedArrivals)
        now = self.env.now
        sent = self._client_sent[client]
        if (
            now >= self.scenario.duration_s
            or (arrivals.requests_per_client is not None and sent >= arrivals.requests_per_client)
            or (arrivals.max_requests is not None and len(self.requests) >= arrivals.max_requests)
        ):
            self._source_done()
            return
        self._client_sent[client] = sent + 1
        index = len(self.requests)
        if arrivals.lengths == "per_request":
            prompt, output = (
                spec if isinstance(spec, int) else int(spec[index])
                for spec in (arrivals.prompt_tokens, arrivals.output_tokens)
            )
        else:
            prompt, output = self._draw(arrivals.prompt_tokens), self._draw(arrivals.output_tokens)
        request = Request(index, now, prompt, output, self._client_drafter[client], client=client)
        self._arrive(request)

    def _source_done(self) -> None:
        self._sources -= 1
        self._check_done()

    def _check_done(self) -> None:
        if self._sources == 0 and self._outstanding == 0 and not self._all_done.triggered:
            self._all_done.succeed()

    # --- a request's rounds -----------------------------------------------------------
    def _arrive(self, request: Request) -> None:
        """Route ``request``; its first work goes to the server after the lead time
        (distributed: the first block is drafted on the client and travels with the
        prompt)."""
        self.requests.append(request)
        self._outstanding += 1
        chosen = self.router.pick(self._active)
        self._active[chosen] += 1
        request.server = chosen
        drafter = self.scenario.drafters[request.drafter]
        k = self._block(request.drafter, request.output_tokens)
        session = _Session(
            request,
            drafter,
            self.acceptance[request.drafter],
            self.servers[chosen],
            remaining=request.output_tokens,
            k=k,
        )
        lead = k * drafter.draft_s_per_token + self._half_rtt if self._distributed else 0.0
        if lead > 0:
            _after(self.env, lead, self._begin, session)
        else:
            self._begin(session)

    def _begin(self, session: _Session) -> None:
        prompt = session.request.prompt_tokens
        if prompt > 0:
            session.rows, session.prefill_tokens, session.draft_s = 0, prompt, 0.0
            session.submitted_s = self.env.now
            session.server.submit(session)
        else:
            session.server.decoding += 1
            self._submit_block(session)

    def _submit_block(self, session: _Session) -> None:
        session.rows = 1 + session.k
        session.draft_s = (
            0.0 if self._distributed else session.k * session.drafter.draft_s_per_token
        )
        session.submitted_s = self.env.now
        session.server.submit(session)

    def _resubmit(self, sessions: list[_Session]) -> None:
        for session in sessions:
            self._submit_block(session)

    def _pass_done(self, batch: list[_Session]) -> None:
        """A pass ended: prefilled sessions send their first block at once; decoded ones
        keep ``accepted + 1`` tokens, then finish or send their next block after the
        link-and-draft gap (one timeout per distinct gap)."""
        now = self.env.now
        half_rtt, distributed = self._half_rtt, self._distributed
        delivered = now + half_rtt
        in_window = delivered <= self.scenario.duration_s
        later: dict[float, list[_Session]] = {}
        for session in batch:
            if session.prefill_tokens:
                session.prefill_tokens = 0
                session.server.decoding += 1
                self._submit_block(session)
                continue
            request = session.request
            tokens = session.acceptance.sample(session.k) + 1  # the bonus token
            session.remaining -= tokens
            request.rounds += 1
            request.produced += tokens
            if request.rounds == 1:
                request.first_token_s = delivered
            if in_window:
                self.tokens_in_window += tokens
            if session.remaining == 0:
                session.server.decoding -= 1
                request.finish_s = delivered
                self._finished(request)
                continue
            drafter = session.drafter
            session.k = k = self._block(session.request.drafter, session.remaining)
            gap = 2 * half_rtt + k * drafter.draft_s_per_token if distributed else 0.0
            if gap > 0:
                later.setdefault(gap, []).append(session)
            else:
                self._submit_block(session)
        for gap, sessions in later.items():
            _after(self.env, gap, self._resubmit, sessions)

    def _finished(self, request: Request) -> None:
        self._active[request.server] -= 1
        self._outstanding -= 1
        if request.client >= 0:  # the answer reaches the client, which thinks, then sends
            arrivals = self.scenario.arrivals
            assert isinstance(arrivals, ClosedArrivals)
            delay = self._half_rtt + arrivals.think_s
            if delay > 0:
                _after(self.env, delay, self._send, request.client)
            else:
                self._send(request.client)
        self._check_done()


def simulate(scenario: Scenario) -> SimLog:
    """Run ``scenario`` once (deterministic for its seed) and return what it recorded."""
    return Simulation(scenario).run()
