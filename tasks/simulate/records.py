"""What a simulation run records: each request (its times, rounds and tokens), each target
pass (as columns), each target server, and the run's whole log (:class:`SimLog`, which
:mod:`tasks.simulate.report` turns into figures)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    client: int = -1  # the closed-loop client that sent it (-1: open arrivals)


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
        self,
        server: int,
        start: float,
        duration: float,
        rows: int,
        requests: int,
        prefill: int,
        queued: int,
    ) -> None:
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
