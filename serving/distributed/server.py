"""The gRPC target server: the TargetService of ``proto/specops_distributed.proto``.

Handlers validate a request completely (session, block length, token ids, sampling) before
any model work and answer a bad one with a gRPC status and a message naming the bad value;
the server keeps serving. The model work itself runs on the :class:`Scheduler`'s thread.

Deadlines and cancellation: a handler waits for its job only while the call is alive. A
verify cancelled (or past its deadline) before its pass started is dropped and the session
is as it was; one whose pass already ran has moved the session on without the client
knowing how far, so the session is closed (a later call gets NOT_FOUND saying why).

Access (:func:`serve_target`): with API keys every call passes the key check of
:mod:`serving.distributed.auth` before its handler; with no key a host beyond loopback is
refused; a certificate and key make the port a TLS one (docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import NoReturn

import grpc

from serving.curves import BatchLimits, PassCost
from serving.distributed.auth import KeyInterceptor
from serving.distributed.proto import specops_distributed_pb2 as pb
from serving.distributed.proto import specops_distributed_pb2_grpc as pb_grpc
from serving.distributed.scheduler import Scheduler, StepDone
from serving.distributed.sessions import ClientBlock, Session, SessionError, SessionTable
from serving.engine.build import build_decoder
from serving.engine.drafters.plan import DraftPlan
from serving.engine.sampling import SamplingParams
from serving.errors import BadInputError, SpecOpsError
from serving.security.keys import ApiKeys, check_bind, is_loopback
from serving.security.tls import ServerTls
from serving.target import LoadedTarget

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often a waiting handler checks that its call is still alive


@dataclass(frozen=True)
class TargetLimits:
    max_sessions: int = 64
    idle_timeout_s: float = 60.0
    max_block: int = 16  # drafts per verify
    max_new_tokens: int = 2048
    # The batching window: a pass waits at most this long (and at most half a pass) for
    # the blocks of the sessions expected back (serving/distributed/scheduler.py).
    batch_window_s: float = 0.025

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_block", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadInputError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0 <= self.batch_window_s <= 1:
            raise BadInputError(
                f"batch_window_s must be between 0 and 1 s, got {self.batch_window_s!r}"
            )
        if not self.idle_timeout_s > 0:
            raise BadInputError(f"idle_timeout_s must be > 0, got {self.idle_timeout_s!r}")


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _status(error: Exception) -> _Abort:
    if isinstance(error, _Abort):
        return error
    if isinstance(error, SessionError):
        return _Abort(getattr(grpc.StatusCode, error.code), str(error))
    if isinstance(error, SpecOpsError):  # BadInputError and the other checked failures
        return _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    return _Abort(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")


def _abort(context, error: Exception) -> NoReturn:
    """End the call with ``error``'s status and message (``context.abort`` raises)."""
    status = _status(error)
    context.abort(status.code, str(status))
    raise AssertionError("unreachable: context.abort raises")


def _reply(done: StepDone) -> pb.StepReply:
    return pb.StepReply(
        session_id=done.session_id,
        proposed=done.proposed,
        accepted=done.accepted,
        new_token_ids=done.new_tokens,
        target_token_id=done.new_tokens[-1],
        emitted_token_ids=done.emitted,
        finished=done.stop_reason is not None,
        stop_reason=done.stop_reason or "",
        pass_s=done.pass_s,
        pass_sessions=done.pass_sessions,
        pass_rows=done.pass_rows,
    )


class TargetService(pb_grpc.TargetServiceServicer):
    """Sessions over one loaded target (its hardware's verify curve prices fused drafts;
    its tokenizer serves fused drafters that need one)."""

    def __init__(
        self,
        target: LoadedTarget,
        *,
        eos_token_ids: Sequence[int] | None = None,
        model_name: str = "target",
        limits: TargetLimits | None = None,
        batch_limits: BatchLimits | None = None,
        cost: PassCost | None = None,
    ) -> None:
        """``eos_token_ids``: where sessions stop (default: the target's)."""
        self.target = target
        eos = target.eos_token_ids if eos_token_ids is None else eos_token_ids
        self.eos_token_ids = [int(t) for t in eos]
        self.model_name = model_name
        self.limits = limits or TargetLimits()
        self.batch_limits = batch_limits or BatchLimits()
        self.vocab_size = target.vocab_size
        self.table = SessionTable(self.limits.max_sessions, self.limits.idle_timeout_s)
        self.scheduler = Scheduler(
            target,
            self.table,
            limits=self.batch_limits,
            cost=cost or PassCost(),
            window_s=self.limits.batch_window_s,
        )
        self.scheduler.start()

    def close(self) -> None:
        self.scheduler.stop()

    # --- helpers ---------------------------------------------------------------------------
    def _wait(self, future: futures.Future, context, session: Session | None = None):
        """The job's result while the call lives; a dead call cancels or closes."""
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except futures.TimeoutError:
                if context.is_active():
                    continue
            except Exception as error:
                raise _status(error) from error
            # The client cancelled or its deadline passed.
            if not future.cancel() and session is not None:
                self.scheduler.close_unknown(
                    session, "a call on it was cancelled after its step ran"
                )
            raise _Abort(grpc.StatusCode.CANCELLED, "the call was cancelled")

    def _session(self, session_id: str) -> Session:
        if not session_id:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is empty")
        return self.table.get(session_id)

    def _check_block(self, session: Session, drafts: list[int], where: str = "") -> list[int]:
        if session.client_block is None and drafts:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{where}session {session.id!r} is fused (the server drafts): send no drafts",
            )
        if len(drafts) > self.limits.max_block:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{where}a block of {len(drafts)} drafts is longer than the server's limit of "
                f"{self.limits.max_block}",
            )
        bad = [t for t in drafts if not 0 <= t < self.vocab_size]
        if bad:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{where}draft token ids {bad[:5]} are outside the vocabulary "
                f"[0, {self.vocab_size})",
            )
        if session.decoding.done:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{where}session {session.id!r} has finished "
                f"({session.decoding.stop_reason}); call Finalize",
            )
        return list(drafts)

    def _build(self, request: pb.StartRequest) -> Session:
        """Check a start request and return the session it asks for (not prefilled)."""
        sampling = request.sampling
        params = SamplingParams(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p if sampling.top_p > 0 else 1.0,
            seed=sampling.seed if sampling.HasField("seed") else None,
        )
        max_new = request.max_new_tokens
        if not 1 <= max_new <= self.limits.max_new_tokens:
            raise BadInputError(
                f"max_new_tokens must be between 1 and {self.limits.max_new_tokens}, got {max_new}"
            )
        fused = bool(request.server_drafter)
        if fused:
            plan = DraftPlan.parse(
                request.server_drafter, policy=request.policy or "fixed", k=request.k or 4
            )
            decoder = build_decoder(self.target, plan, eos_token_ids=self.eos_token_ids)
        else:
            if request.policy or request.k:
                raise BadInputError(
                    "policy and k are for fused sessions (server_drafter); a draft client "
                    "chooses its own block lengths"
                )
            # The client drafts (no kind of this server's: its blocks arrive with the
            # calls); the server verifies blocks of at most max_block tokens.
            client = DraftPlan(policy="fixed", k=self.limits.max_block)
            decoder = build_decoder(
                self.target, client, drafter=ClientBlock(), eos_token_ids=self.eos_token_ids
            )
        decoding = decoder.begin(
            list(request.prompt_token_ids), max_new_tokens=max_new, sampling=params
        )
        return Session(self.table.new_id(), decoding, fused=fused)

    # --- the service -----------------------------------------------------------------------
    def Info(self, request, context):
        return pb.InfoReply(
            model=self.model_name,
            vocab_size=self.vocab_size,
            max_block=self.limits.max_block,
            max_sessions=self.limits.max_sessions,
            idle_timeout_s=self.limits.idle_timeout_s,
            max_batch=self.batch_limits.max_sequences,
            active_sessions=len(self.table),
        )

    def StartSession(self, request, context):
        try:
            self.table.reserve()
            session = self._build(request)  # checked here, prefilled on the scheduler
            future = self.scheduler.start_session(lambda: session)
            started = self._wait(future, context)
        except Exception as error:
            _abort(context, error)
        if not context.is_active():  # the client is gone: do not keep its state
            self.scheduler.close_unknown(started, "the client left during the prefill")
        return pb.StartReply(session_id=started.id, fused=started.fused)

    def Verify(self, request, context):
        try:
            session = self._session(request.session_id)
            drafts = self._check_block(session, list(request.draft_token_ids))
            future = self.scheduler.step(session, drafts if not session.fused else None)
            done = self._wait(future, context, session)
        except Exception as error:
            _abort(context, error)
        return pb.VerifyReply(step=_reply(done))

    def VerifyBatch(self, request, context):
        try:
            jobs = []
            seen: set[str] = set()
            for index, block in enumerate(request.blocks):
                where = f"block {index}: "
                if block.session_id in seen:
                    raise _Abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{where}session {block.session_id!r} appears twice; one block per "
                        "session per call",
                    )
                seen.add(block.session_id)
                try:
                    session = self._session(block.session_id)
                except SessionError as error:
                    raise _Abort(grpc.StatusCode.NOT_FOUND, f"{where}{error}") from error
                drafts = self._check_block(session, list(block.draft_token_ids), where)
                jobs.append((session, drafts if not session.fused else None))
            # Submitted together: the scheduler takes them into one pass (as limits allow).
            waiting = [(s, self.scheduler.step(s, d)) for s, d in jobs]
            steps = []
            try:
                for session, future in waiting:
                    steps.append(_reply(self._wait(future, context, session)))
            except Exception:
                # The client gets no reply for any block: a step that already ran moved its
                # session on unseen, so that session is closed; the others are dropped.
                for session, future in waiting[len(steps) :]:
                    if not future.cancel():
                        self.scheduler.close_unknown(
                            session, "a VerifyBatch call on it failed after its step ran"
                        )
                for session, _ in waiting[: len(steps)]:
                    self.scheduler.close_unknown(
                        session, "a VerifyBatch call on it failed after its step ran"
                    )
                raise
        except Exception as error:
            _abort(context, error)
        return pb.VerifyBatchReply(steps=steps)

    def Generate(self, request, context) -> Iterator[pb.StepReply]:
        try:
            session = self._session(request.session_id)
            if not session.fused:
                raise _Abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"session {session.id!r} is not fused: its client drafts; use Verify",
                )
            self._check_block(session, [])
        except Exception as error:
            _abort(context, error)
        ended = False
        try:
            while not session.decoding.done:
                try:
                    done = self._wait(self.scheduler.step(session, None), context, session)
                except Exception as error:
                    _abort(context, error)
                yield _reply(done)
            ended = True
        finally:
            if not ended:  # the client went away mid-stream: nobody will finalize it
                self.scheduler.close_unknown(session, "its Generate stream was cancelled")

    def Finalize(self, request, context):
        try:
            session = self._session(request.session_id)
            result = self._wait(self.scheduler.finalize(session), context)
        except Exception as error:
            _abort(context, error)
        stats = result.stats
        return pb.FinalizeReply(
            output_token_ids=result.token_ids,
            stop_reason=result.stop_reason,
            steps=len(result.steps),
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            prefill_s=stats.prefill_s,
        )


@dataclass
class RunningServer:
    server: grpc.Server
    service: TargetService
    port: int

    def stop(self, grace_s: float = 1.0) -> None:
        self.server.stop(grace_s).wait()
        self.service.close()


def serve_target(
    service: TargetService,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    handlers: int = 0,
    keys: ApiKeys | None = None,
    tls: ServerTls | None = None,
    allow_unauthenticated: bool = False,
) -> RunningServer:
    """Start serving ``service`` on ``host:port`` (0: any free port); returns at once.

    With ``keys`` every call needs one of them (:class:`~serving.distributed.auth.KeyInterceptor`);
    without, a host beyond loopback is refused unless ``allow_unauthenticated``, as the HTTP
    server refuses it. With ``tls`` the port is a TLS one (grpcio's own)."""
    keys = keys or ApiKeys((), ())
    try:
        check_bind(host, keys, allow_open=allow_unauthenticated, key_file="--api-key-file")
    except BadInputError:
        service.close()
        raise
    if keys.enabled and tls is None and not is_loopback(host):
        log.warning(
            "serving %s with API keys but no TLS: the keys cross the network in clear text "
            "(--tls-cert/--tls-key, docs/security.md)",
            host,
        )
    workers = handlers or service.limits.max_sessions + 8
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specops-grpc"),
        interceptors=[KeyInterceptor(keys)] if keys.enabled else None,
        # Bounded: past this many calls in flight a new call is refused at once.
        maximum_concurrent_rpcs=workers,
    )
    pb_grpc.add_TargetServiceServicer_to_server(service, server)
    address = f"{host}:{port}"
    # Older grpcio returns 0 for an address it cannot bind; newer raises RuntimeError.
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, tls.grpc_credentials())
    except (RuntimeError, BadInputError) as error:
        service.close()
        if isinstance(error, BadInputError):
            raise
        raise BadInputError(f"cannot bind the target server to {address}: {error}") from None
    if bound == 0:
        service.close()
        raise BadInputError(f"cannot bind the target server to {address}")
    server.start()
    log.info(
        "target server listening on %s:%d (%s, %s)",
        host,
        bound,
        "TLS" if tls else "no TLS",
        f"{len(keys.digests)} API keys" if keys.enabled else "no API key",
    )
    return RunningServer(server, service, bound)
