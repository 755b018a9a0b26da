"""The decode loop of the server: continuous batching on worker threads.

Requests wait in a bounded queue (a full queue refuses at once, so the HTTP layer answers
429, with ``Retry-After`` from the queue's measured drain rate: :mod:`serving.server.drain`).
Each of ``workers`` threads owns a :class:`serving.engine.batch.batch.Batch` of up to its
share of ``max_active`` requests (and of the hardware target's ``max_batch``). Between two
steps a worker takes in waiting requests (each is prefilled alone as it joins), drops the
ones that finished, failed, were cancelled or ran past their deadline, and then runs one
packed target pass for all the rest: every request's pending token and drafts in one
pass, each verified on its own rows. Each request keeps its own drafter, policy, sampler
and KV caches, so joining a batch does not change its output (tests/serving/engine/batch).

Threads: torch releases the GIL inside its kernels, so two workers with one intra-op
thread each keep both cores of this machine busy. Measured on this 2-core CPU, two
intra-op threads in a worker thread ran ~2x slower than in the main thread (OpenMP's
busy-waiting team fights the event loop's thread for the cores), while one thread per
worker ran at full speed beside the event loop; ``threads_per_worker`` sets it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.curves import BatchLimits, PassCost
from serving.engine.batch.batch import Batch
from serving.engine.decoder import Decoding, Generation
from serving.errors import SpecOpsError
from serving.server.drain import DrainRate
from serving.target import LoadedTarget

log = logging.getLogger(__name__)


class QueueFullError(SpecOpsError):
    """The request queue is full: try again in ``retry_after_s`` (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


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
        target: LoadedTarget | None = None,
        batch: BatchLimits | None = None,
        cost: PassCost | None = None,
        on_pass: Callable[[int, int], None] | None = None,
    ) -> None:
        """``target``: the model every request decodes on (the batches' target; ``None``:
        taken from the first request). ``batch``: the hardware target's batch limits, cut
        to each worker's share of ``max_active``. ``on_pass(size, tokens)`` is called
        after every packed pass (metrics)."""
        self.queue_size = queue_size
        self.max_active = max_active
        self.workers = min(workers, max_active)  # never more requests in flight than asked
        workers = self.workers
        self.threads_per_worker = threads_per_worker
        per_worker = max(1, max_active // workers)
        limits = batch or BatchLimits(per_worker, max(64, per_worker))
        sequences = min(limits.max_sequences, per_worker)
        self.limits = BatchLimits(
            max_sequences=sequences,
            max_tokens_per_pass=max(limits.max_tokens_per_pass, sequences),
        )
        self.target = target
        self.cost = cost or PassCost()
        self.on_pass = on_pass
        self.drain = DrainRate()
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
    def full(self) -> bool:
        """Whether a new request would be refused now (read without the lock: a hint for
        refusing before a body is parsed; :meth:`submit` decides)."""
        return len(self._waiting) >= self.queue_size

    def full_error(self) -> QueueFullError:
        waiting = len(self._waiting)
        retry_after = self.drain.retry_after_s(waiting)
        return QueueFullError(
            f"the request queue is full ({waiting} waiting); retry in {retry_after} s",
            retry_after,
        )

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
        if job.generation.decoding is None:
            raise SpecOpsError("a job needs a generation from SpeculativeDecoder.stream")
        with self._wake:
            if self._stopping:
                raise SchedulerClosedError("the server is shutting down")
            if len(self._waiting) >= self.queue_size:
                raise self.full_error()
            self._waiting.append(job)
            self._wake.notify()

    def _take(self, active: list[Job]) -> list[Job]:
        """Wait for work; move waiting jobs into ``active`` while its batch has room."""
        taken = []
        with self._wake:
            while not self._stopping and not active and not self._waiting:
                self._wake.wait()
            while self._waiting and len(active) < self.limits.max_sequences:
                job = self._waiting.popleft()
                job.started_at = time.monotonic()
                active.append(job)
                taken.append(job)
        return taken

    def _run(self, index: int) -> None:
        if self.threads_per_worker:
            import torch

            torch.set_num_threads(self.threads_per_worker)  # per calling thread
        active = self._active[index]
        batch: Batch | None = None
        while True:
            taken = self._take(active)
            if self._stopping:
                with self._wake:
                    leftovers = [*active, *self._waiting]
                    self._waiting.clear()
                for job in leftovers:
                    self._finish(batch, active, job, "cancelled", "the server is shutting down")
                return
            for job in taken:
                decoding = _decoding(job)
                if batch is None:
                    batch = Batch(self.target or decoding.decoder.target, self.limits, self.cost)
                try:
                    batch.join(decoding)
                except Exception as error:  # a prefill that fails fails its request alone
                    log.exception("a request failed while joining the batch")
                    self._finish(batch, active, job, "error", error)
            for job in list(active):
                if job.cancel_reason is None and time.monotonic() > job.deadline:
                    job.cancel("timeout")
                if job.cancel_reason is not None:
                    self._finish(batch, active, job, "cancelled", job.cancel_reason)
            if batch is not None and active:
                self._step(batch, active)
            self._cut_waiting(batch, active)

    def _step(self, batch: Batch, active: list[Job]) -> None:
        try:
            outcome = batch.step()
        except Exception as step_error:  # not one request's: fail them all, go on
            log.exception("a batch step failed")
            for job in list(active):
                self._finish(batch, active, job, "error", step_error)
            return
        if outcome.size and self.on_pass is not None:
            self.on_pass(outcome.size, outcome.rows)
        for job in list(active):
            decoding = _decoding(job)
            error = outcome.errors.get(decoding)
            if error is not None:
                self._finish(batch, active, job, "error", error)
                continue
            for event in outcome.events.get(decoding, ()):
                job.emit("token", event)
            if decoding.done:
                self._finish(batch, active, job, "done", None)

    def _cut_waiting(self, batch: Batch | None, active: list[Job]) -> None:
        """Jobs cut while still waiting (client gone, deadline passed) leave the queue too."""
        with self._wake:
            now = time.monotonic()
            for job in self._waiting:
                if job.cancel_reason is None and now > job.deadline:
                    job.cancel("timeout")
            cut = [j for j in self._waiting if j.cancel_reason is not None]
            for job in cut:
                self._waiting.remove(job)
        for job in cut:
            self._finish(batch, active, job, "cancelled", job.cancel_reason)

    def _finish(
        self, batch: Batch | None, active: list[Job], job: Job, kind: str, payload: object
    ) -> None:
        """End ``job``: out of the batch, its drafter released, its result set, and the
        end delivered."""
        decoding = _decoding(job)
        if batch is not None:
            batch.leave(decoding)
        decoding.release()
        generation = job.generation
        if kind in ("done", "cancelled"):
            generation.result = decoding.finish("cancelled" if kind == "cancelled" else None)
            if kind == "done":
                payload = generation.result
        if job in active:
            active.remove(job)
        self.drain.record()
        try:
            job.emit(kind, payload)
        except Exception:  # a dead client must not stop the loop
            log.exception("could not deliver the end of a request")


def _decoding(job: Job) -> Decoding:
    decoding = job.generation.decoding
    assert decoding is not None  # submit() checked
    return decoding
