"""The target server's sessions: each one request's decoding state, limits and expiry.

A session is a :class:`serving.engine.decoder.Decoding` whose drafter is either the client's block
(:class:`ClientBlock`, a distributed session) or a drafter of the server's own (a fused
session). Everything the engine does per request (KV cache, sampler, budget, EOS, the
policy's bookkeeping) is the engine's; this module only adds identity, ownership and time.
Not thread-safe: the scheduler thread is the only one that touches sessions' state, and the
table's lock guards only the mapping.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from serving.engine.decoder import Decoding
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback


class SessionError(Exception):
    """A request about a session the server cannot serve; ``code`` names the gRPC status
    (``NOT_FOUND``, ``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``, ``RESOURCE_EXHAUSTED``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientBlock(Drafter):
    """The drafts a remote client sent for this step, proposed as they are.

    The server never sees the client's draft distribution, so every block is verified as a
    deterministic proposal (one-hot). That is lossless for any way the client chose its
    tokens: a token ``x`` kept with probability ``p(x)`` and otherwise replaced by a draw
    from the residual ``(p - δx)+`` leaves the output distributed as ``p`` (docs/distributed.md);
    a sampling client only loses some acceptance against sending its probabilities."""

    name = "client"
    kind = "client"  # no spec kind: the drafts a remote client sent

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def stage(self, tokens: list[int]) -> None:
        self.tokens = list(tokens)

    def begin(self, prompt: list[int]) -> None:
        self.tokens = []

    def propose(self, request: DraftRequest) -> DraftProposal:
        return DraftProposal(torch.tensor(self.tokens[: request.k], dtype=torch.int64))

    def commit(self, feedback: StepFeedback) -> None:
        self.tokens = []

    def describe(self) -> dict[str, object]:
        return {"name": "client"}


@dataclass(eq=False)
class Session:
    id: str
    decoding: Decoding
    fused: bool
    last_used: float = field(default_factory=time.monotonic)
    # What idle time is measured on: the table's clock once the session is added.
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    busy: int = 0  # jobs queued or running for it: never expired while busy
    # When its last reply left (None: its next block is in, or it has had no reply), and
    # how long its client takes to answer a reply with the next block (a moving average):
    # the batching window waits only for sessions expected back within it.
    replied_at: float | None = None
    turnaround_s: float | None = None

    def came_back(self, now: float) -> None:
        """Its next block arrived: learn the turnaround."""
        if self.replied_at is not None:
            sample = now - self.replied_at
            previous = self.turnaround_s
            self.turnaround_s = sample if previous is None else 0.7 * previous + 0.3 * sample
            self.replied_at = None

    @property
    def client_block(self) -> ClientBlock | None:
        drafter = self.decoding.drafter
        return drafter if isinstance(drafter, ClientBlock) else None

    def touch(self) -> None:
        self.last_used = self.clock()


class SessionTable:
    """Live sessions by id, at most ``limit``; ids of closed sessions are remembered (the
    most recent ``remember``) so that a late call learns why its session is gone. Idle
    time is measured on ``clock`` (monotonic seconds; a test may set its own before any
    session is added)."""

    def __init__(
        self,
        limit: int,
        idle_timeout_s: float,
        remember: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self._live: dict[str, Session] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._remember = remember
        self._lock = threading.Lock()
        self._counter = itertools.count(1)

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)

    def new_id(self) -> str:
        return f"s{next(self._counter)}-{secrets.token_hex(6)}"

    def reserve(self) -> None:
        """Raise when no room is left (checked before any prefill)."""
        with self._lock:
            if len(self._live) >= self.limit:
                raise SessionError(
                    "RESOURCE_EXHAUSTED",
                    f"the server holds its limit of {self.limit} sessions; finalize one or "
                    "retry later",
                )

    def add(self, session: Session) -> None:
        with self._lock:
            if len(self._live) >= self.limit:
                raise SessionError(
                    "RESOURCE_EXHAUSTED", f"the server holds its limit of {self.limit} sessions"
                )
            session.clock = self.clock
            session.touch()  # idle from now, on the table's clock
            self._live[session.id] = session

    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._live.get(session_id)
            if session is not None:
                return session
            why = self._gone.get(session_id)
        if why is not None:
            raise SessionError("NOT_FOUND", f"session {session_id!r} is gone: {why}")
        raise SessionError("NOT_FOUND", f"unknown session {session_id!r}")

    def remove(self, session_id: str, why: str) -> Session | None:
        with self._lock:
            session = self._live.pop(session_id, None)
            if session is not None:
                self._gone[session_id] = why
                while len(self._gone) > self._remember:
                    self._gone.popitem(last=False)
            return session

    def unfinished(self) -> list[Session]:
        """Live sessions still decoding (a step from each may be on its way)."""
        with self._lock:
            return [s for s in self._live.values() if not s.decoding.done]

    def idle(self, now: float | None = None) -> list[Session]:
        """Sessions with nothing pending, unused for longer than the idle timeout."""
        now = self.clock() if now is None else now
        with self._lock:
            return [
                s
                for s in self._live.values()
                if not s.busy and now - s.last_used > self.idle_timeout_s
            ]
