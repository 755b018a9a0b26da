"""The thread that owns the target: prefills, verifies and finalizes, one job at a time,
every waiting verify of every session in one packed pass.

gRPC handlers run on a thread pool; none of them touches the model. Each submits a job and
waits for its future. The scheduler takes every waiting job: session starts (a prefill each)
and finalizations first, then up to ``max_batch`` verify jobs of distinct sessions within
``max_tokens_per_pass`` rows as one pass (:func:`serving.engine.batch.batch.verify_drafted`, the
batching engine's own pass and settle), oldest first; what does not fit waits for the next
pass. A fused session's job drafts on this thread with the session's own drafter and policy.
Idle sessions are expired between passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from serving.curves import BatchLimits, PassCost
from serving.distributed.sessions import Session, SessionError, SessionTable
from serving.engine.batch.batch import StepOutcome, verify_drafted
from serving.engine.batch.ragged import use_ragged_attention
from serving.engine.decoder import Decoding
from serving.engine.request import GenerationResult
from serving.engine.step import DraftedBlock
from serving.target import LoadedTarget

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepDone:
    """One verified block, as the session's reply reports it."""

    session_id: str
    proposed: int
    accepted: int
    new_tokens: list[int]  # the kept drafts, then the target's token
    emitted: list[int]  # what joined the output (cut at EOS and the budget)
    stop_reason: str | None
    pass_s: float
    pass_sessions: int
    pass_rows: int


@dataclass(eq=False)
class _Job:
    kind: str  # "start" | "step" | "finalize"
    future: Future = field(default_factory=Future)
    session: Session | None = None
    drafts: list[int] | None = None  # a step's client block; None: the server drafts (fused)
    build: Callable[[], Session] | None = None  # a start: makes the session (not prefilled)

    @property
    def rows(self) -> int:
        return 1 + len(self.drafts or ())


class Scheduler:
    """Runs jobs on one thread; :meth:`submit` from any thread."""

    def __init__(
        self,
        target: LoadedTarget,
        table: SessionTable,
        *,
        limits: BatchLimits,
        cost: PassCost,
        window_s: float = 0.025,
        tick_s: float = 0.25,
    ) -> None:
        use_ragged_attention(target.model)
        self.target = target
        self.table = table
        self.limits = limits
        self.cost = cost
        self.window_s = window_s
        self._pass_ewma_s: float | None = None  # verify passes' duration, a moving average
        self._tick_s = tick_s
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="specops-target", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)

    # --- called from handler threads -------------------------------------------------------
    def submit(self, job: _Job) -> Future:
        with self._cond:
            if self._stopping:
                raise SessionError("UNAVAILABLE", "the target server is shutting down")
            if job.session is not None:
                job.session.busy += 1
                job.session.touch()
                if job.kind == "step":
                    job.session.came_back(time.monotonic())
            self._jobs.append(job)
            self._cond.notify()
        return job.future

    def start_session(self, build: Callable[[], Session]) -> Future:
        return self.submit(_Job("start", build=build))

    def step(self, session: Session, drafts: list[int] | None) -> Future:
        return self.submit(_Job("step", session=session, drafts=drafts))

    def finalize(self, session: Session) -> Future:
        return self.submit(_Job("finalize", session=session))

    # --- the scheduler thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._stopping:
                    self._cond.wait(self._tick_s)
                self._gather()
                if self._stopping:
                    jobs = list(self._jobs)
                    self._jobs.clear()
                    for job in jobs:
                        job.future.set_exception(
                            SessionError("UNAVAILABLE", "the target server is shutting down")
                        )
                    return
                jobs = list(self._jobs)
                self._jobs.clear()
            try:
                with torch.inference_mode():
                    leftover = self._work(jobs)
            except Exception as error:  # never let the thread die: fail what it held
                log.exception("the target scheduler failed a round")
                leftover = []
                for job in jobs:
                    if job.future.done():
                        continue
                    if job.kind == "step" and job.future.running():
                        self._fail(job, error)  # its session's state is unknown: closed
                    else:
                        job.future.set_exception(error)
                        self._done(job)
            with self._cond:
                self._jobs.extendleft(reversed(leftover))
            self._expire()

    def window(self) -> float:
        """This pass's batching window: ``window_s``, but never more than half a pass (a
        longer wait would cost more than a second pass saves)."""
        if self._pass_ewma_s is None:
            return self.window_s
        return min(self.window_s, self._pass_ewma_s / 2)

    def _gather(self) -> None:
        """The batching window (holding ``_cond``). Sessions answer each reply with their
        next block, so without waiting two sessions would alternate, each alone in its
        pass. From now (the target is free: counted from the oldest block's arrival, that
        alternation would never break), wait at most :meth:`window` for every unfinished
        session expected back within it (its reply's time plus its measured turnaround);
        a session not expected that soon, or long overdue, is not waited for."""
        if not any(j.kind == "step" for j in self._jobs) or not self.window_s:
            return
        now = time.monotonic()
        window = self.window()
        deadline = now + window
        waiting = {j.session.id for j in self._jobs if j.kind == "step" and j.session}
        expected = set()
        for session in self.table.unfinished():
            if session.id in waiting or session.replied_at is None:
                continue
            turnaround = session.turnaround_s
            due = session.replied_at + (turnaround or 0.0)
            overdue = now - session.replied_at > 2 * (turnaround or window) + window
            if due <= deadline and not overdue:
                expected.add(session.id)
        room = self.limits.max_sequences
        while not self._stopping and expected and len(waiting) < room:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)
            arrived = {j.session.id for j in self._jobs if j.kind == "step" and j.session}
            expected -= arrived
            waiting |= arrived

    def _done(self, job: _Job) -> None:
        if job.session is not None:
            with self._cond:
                job.session.busy -= 1
                job.session.touch()
                if job.kind == "step":
                    job.session.replied_at = time.monotonic()  # its client has the verdict

    def _work(self, jobs: list[_Job]) -> list[_Job]:
        steps: list[_Job] = []
        for job in jobs:
            if job.kind == "step":
                steps.append(job)
            elif job.future.set_running_or_notify_cancel():
                try:
                    result = self._start(job) if job.kind == "start" else self._finalize(job)
                except Exception as error:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(result)
                finally:
                    self._done(job)
            else:
                self._done(job)
        return self._steps(steps)

    def _start(self, job: _Job) -> Session:
        assert job.build is not None
        session = job.build()  # the handler reserved room; add() checks it again
        try:
            session.decoding.prefill()
            session.touch()  # idle from now, not from when the request was checked
            session.replied_at = time.monotonic()  # its first block follows the reply
            self.table.add(session)
        except Exception:
            session.decoding.release()
            raise
        return session

    def _finalize(self, job: _Job) -> GenerationResult:
        session = job.session
        assert session is not None
        self.table.remove(session.id, "finalized")
        return session.decoding.finish(None if session.decoding.done else "cancelled")

    def _live(self, session: Session) -> None:
        self.table.get(session.id)  # raises NOT_FOUND for a session expired meanwhile
        if session.decoding.done:
            raise SessionError(
                "FAILED_PRECONDITION",
                f"session {session.id!r} has finished ({session.decoding.stop_reason}); "
                "call Finalize",
            )

    def _steps(self, jobs: list[_Job]) -> list[_Job]:
        """One pass for the oldest jobs that fit; returns the ones left for the next."""
        riding: list[_Job] = []
        leftover: list[_Job] = []
        seen: set[str] = set()
        rows = 0
        for job in jobs:
            session = job.session
            assert session is not None
            fits = (
                len(riding) < self.limits.max_sequences
                and rows + job.rows <= self.limits.max_tokens_per_pass
            )
            if session.id in seen or (riding and not fits):
                leftover.append(job)
                continue
            if not job.future.set_running_or_notify_cancel():
                self._done(job)  # cancelled while waiting: the session is as it was
                continue
            try:
                self._live(session)
            except SessionError as error:
                job.future.set_exception(error)
                self._done(job)
                continue
            seen.add(session.id)
            riding.append(job)
            rows += job.rows
        if riding:
            self._pass(riding)
        return leftover

    def _draft(self, job: _Job) -> DraftedBlock:
        session = job.session
        assert session is not None
        decoding = session.decoding
        block = session.client_block
        if block is None:  # fused: the session's own drafter and policy
            return decoding.draft(decoding.next_k())
        drafts = job.drafts or []
        block.stage(drafts)
        # Never past the budget: the target's own token always comes on top.
        return decoding.draft(min(len(drafts), max(decoding.remaining - 1, 0)))

    def _pass(self, riding: list[_Job]) -> None:
        outcome = StepOutcome()
        drafted: dict[Decoding, DraftedBlock] = {}
        draft_s: dict[Decoding, float] = {}
        jobs: dict[Decoding, _Job] = {}
        for job in riding:
            session = job.session
            assert session is not None
            started = time.perf_counter()
            try:
                drafted[session.decoding] = self._draft(job)
            except Exception as error:
                log.exception("drafting failed for session %s", session.id)
                self._fail(job, error)
                continue
            draft_s[session.decoding] = time.perf_counter() - started
            jobs[session.decoding] = job
        verify_drafted(self.target, self.cost, drafted, draft_s, outcome)
        if outcome.pass_s:
            previous = self._pass_ewma_s
            self._pass_ewma_s = (
                outcome.pass_s if previous is None else 0.7 * previous + 0.3 * outcome.pass_s
            )
        for decoding, job in jobs.items():
            if decoding in outcome.errors:
                self._fail(job, outcome.errors[decoding])
                continue
            events = outcome.events[decoding]
            last = decoding.request.steps[-1]
            tokens = decoding.tokens
            new_tokens = tokens[len(tokens) - (last.accepted + 1) :]
            job.future.set_result(
                StepDone(
                    session_id=job.session.id,  # type: ignore[union-attr]
                    proposed=last.proposed,
                    accepted=last.accepted,
                    new_tokens=list(new_tokens),
                    emitted=[e.token_id for e in events],
                    stop_reason=decoding.stop_reason,
                    pass_s=outcome.pass_s,
                    pass_sessions=outcome.size,
                    pass_rows=outcome.rows,
                )
            )
            self._done(job)

    def _fail(self, job: _Job, error: Exception) -> None:
        """A step that raised leaves its session in an unknown state: close it."""
        session = job.session
        assert session is not None
        self.table.remove(session.id, f"a step failed on the server: {error}")
        session.decoding.release()
        job.future.set_exception(error)
        self._done(job)

    def close_unknown(self, session: Session, why: str) -> None:
        """Close a session whose client cannot know its state (a reply it never got)."""
        if self.table.remove(session.id, why) is not None:
            self.submit(_Job("finalize", session=session))

    def _expire(self) -> None:
        for session in self.table.idle():
            if self.table.remove(session.id, f"idle for more than {self.table.idle_timeout_s:g} s"):
                log.info("session %s expired", session.id)
                session.decoding.release()
