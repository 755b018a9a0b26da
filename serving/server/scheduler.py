"""The decode loop of the server: one worker thread owns every model call.

Requests wait in a bounded queue (a full queue refuses at once, so the HTTP layer answers
429); up to ``max_active`` are decoded concurrently, round-robin one token at a time, so a
short request is not stuck behind a long one. Each request has its own drafter, policy and
KV caches, so interleaving never mixes state. A request whose client went away or whose
deadline passed is closed between tokens (its drafter releases its state).

Why not batch: the engine verifies one sequence per target pass; batching sequences with
different acceptance needs ragged KV caches (per-sequence rewind), which the transformers
caches do not offer. Round-robin gives fairness; a batched verifier is the next step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.engine import Generation, GenerationResult, TokenEvent
from serving.errors import SpecOpsError

log = logging.getLogger(__name__)


class QueueFullError(SpecOpsError):
    """The request queue is full: try again later (HTTP 429)."""


class SchedulerClosedError(SpecOpsError):
    """The server is shutting down (HTTP 503)."""


@dataclass(eq=False)
class Job:
    generation: Generation
    # Called from the worker thread with ("token", TokenEvent), ("done", GenerationResult),
    # ("error", Exception) or ("cancelled", reason); it must be thread-safe and quick.
    emit: Callable[[str, object], None]
    deadline: float  # time.monotonic() past which the request is cut
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    cancel_reason: str | None = None

    def cancel(self, reason: str) -> None:
        """Ask the worker to stop this request (safe from any thread)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason


class Scheduler:
    def __init__(self, *, queue_size: int, max_active: int) -> None:
        self.queue_size = queue_size
        self.max_active = max_active
        self._waiting: deque[Job] = deque()
        self._active: list[Job] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specops-decode", daemon=True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        with self._wake:
            if self._stopping:
                raise SchedulerClosedError("the server is shutting down")
            if len(self._waiting) >= self.queue_size:
                raise QueueFullError(
                    f"the request queue is full ({self.queue_size} waiting); retry later"
                )
            self._waiting.append(job)
            self._wake.notify()

    def _admit(self) -> None:
        with self._wake:
            while not self._stopping and not self._active and not self._waiting:
                self._wake.wait()
            while self._waiting and len(self._active) < self.max_active:
                job = self._waiting.popleft()
                job.started_at = time.monotonic()
                self._active.append(job)

    def _run(self) -> None:
        while True:
            self._admit()
            if self._stopping:
                for job in [*self._active, *self._waiting]:
                    self._finish(job, "cancelled", "the server is shutting down")
                self._active.clear()
                self._waiting.clear()
                return
            for job in list(self._active):
                if job.cancel_reason is None and time.monotonic() > job.deadline:
                    job.cancel("timeout")
                if job.cancel_reason is not None:
                    self._finish(job, "cancelled", job.cancel_reason)
                    continue
                try:
                    event: TokenEvent = next(job.generation)
                except StopIteration:
                    result: GenerationResult | None = job.generation.result
                    self._finish(job, "done", result)
                    continue
                except Exception as error:
                    log.exception("request failed while decoding")
                    self._finish(job, "error", error)
                    continue
                job.emit("token", event)
            # Jobs cut while still waiting (client gone, deadline passed) leave the queue too.
            with self._wake:
                now = time.monotonic()
                for job in self._waiting:
                    if job.cancel_reason is None and now > job.deadline:
                        job.cancel("timeout")
                for job in [j for j in self._waiting if j.cancel_reason is not None]:
                    self._waiting.remove(job)
                    self._finish(job, "cancelled", job.cancel_reason)

    def _finish(self, job: Job, kind: str, payload: object) -> None:
        if kind == "cancelled":
            job.generation.close()
        if job in self._active:
            self._active.remove(job)
        try:
            job.emit(kind, payload)
        except Exception:
            log.exception("could not deliver the end of a request")
