"""The decode loop of the server: worker threads own every model call.

Requests wait in a bounded queue (a full queue refuses at once, so the HTTP layer answers
429). Each of ``workers`` threads decodes up to its share of ``max_active`` requests
concurrently, round-robin one token at a time, so a short request is not stuck behind a
long one. Each request has its own drafter, policy and KV caches, so interleaving never
mixes state. A request whose client went away or whose deadline passed is closed between
tokens (its drafter releases its state).

Threads: torch releases the GIL inside its kernels, so two workers with one intra-op
thread each decode two requests in parallel on two cores. Measured on this 2-core CPU,
two intra-op threads in a worker thread ran ~2x slower than in the main thread (OpenMP's
busy-waiting team fights the event loop's thread for the cores), while one thread per
worker ran at full speed beside the event loop; ``threads_per_worker`` sets it.

Why not batch: the engine verifies one sequence per target pass; batching sequences with
different acceptance needs ragged KV caches (per-sequence rewind), which the transformers
caches do not offer.
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
    def __init__(
        self,
        *,
        queue_size: int,
        max_active: int,
        workers: int = 1,
        threads_per_worker: int | None = None,
    ) -> None:
        self.queue_size = queue_size
        self.max_active = max_active
        self.workers = min(workers, max_active)  # never more requests in flight than asked
        workers = self.workers
        self.threads_per_worker = threads_per_worker
        self._per_worker = max(1, max_active // workers)
        self._waiting: deque[Job] = deque()
        self._active: list[list[Job]] = [[] for _ in range(workers)]
        self._wake = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"specops-decode-{i}", daemon=True)
            for i in range(workers)
        ]

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(len(active) for active in self._active)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

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

    def _admit(self, active: list[Job]) -> None:
        with self._wake:
            while not self._stopping and not active and not self._waiting:
                self._wake.wait()
            while self._waiting and len(active) < self._per_worker:
                job = self._waiting.popleft()
                job.started_at = time.monotonic()
                active.append(job)

    def _run(self, index: int) -> None:
        if self.threads_per_worker:
            import torch

            torch.set_num_threads(self.threads_per_worker)  # per calling thread
        active = self._active[index]
        while True:
            self._admit(active)
            if self._stopping:
                with self._wake:
                    leftovers = [*active, *self._waiting]
                    self._waiting.clear()
                for job in leftovers:
                    self._finish(active, job, "cancelled", "the server is shutting down")
                active.clear()
                return
            for job in list(active):
                if job.cancel_reason is None and time.monotonic() > job.deadline:
                    job.cancel("timeout")
                if job.cancel_reason is not None:
                    self._finish(active, job, "cancelled", job.cancel_reason)
                    continue
                try:
                    event: TokenEvent = next(job.generation)
                except StopIteration:
                    result: GenerationResult | None = job.generation.result
                    self._finish(active, job, "done", result)
                    continue
                except Exception as error:  # reported to the request, not lost
                    log.exception("request failed while decoding")
                    self._finish(active, job, "error", error)
                    continue
                job.emit("token", event)
            # Jobs cut while still waiting (client gone, deadline passed) leave the queue too.
            with self._wake:
                now = time.monotonic()
                for job in self._waiting:
                    if job.cancel_reason is None and now > job.deadline:
                        job.cancel("timeout")
                cut = [j for j in self._waiting if j.cancel_reason is not None]
                for job in cut:
                    self._waiting.remove(job)
            for job in cut:
                self._finish(active, job, "cancelled", job.cancel_reason)

    def _finish(self, active: list[Job], job: Job, kind: str, payload: object) -> None:
        if kind == "cancelled":
            job.generation.close()
        if job in active:
            active.remove(job)
        try:
            job.emit(kind, payload)
        except Exception:  # a dead client must not stop the loop
            log.exception("could not deliver the end of a request")
