"""The draft client: any specops drafter on this side, the target across a gRPC link.

:class:`TargetClient` is the protocol (one method per call, every gRPC failure turned into a
:class:`RemoteError` naming the status and the server's message); :func:`run_distributed`
decodes one request with a local drafter and policy, a round trip per step;
:func:`run_fused` asks the server to draft too and reads the steps as a stream.

``rtt_s`` injects a round-trip time on the client (for benchmarks on loopback, where the
real one is ~0.1 ms): every unary call sleeps ``rtt_s / 2`` before it is sent and after its
reply arrives; a stream's request waits ``rtt_s / 2`` and each of its messages is handed on
``rtt_s / 2`` after it arrived (a stream pays the delay once, not per message, as on a real
link). The server never sees the delay.

Every call carries the client's API key as ``authorization: Bearer <key>`` metadata (the
target server's keys, :mod:`serving.distributed.auth`); ``tls``/``tls_ca`` make the channel
a TLS one (docs/security.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from serving.distributed.proto import specops_distributed_pb2 as pb
from serving.distributed.proto import specops_distributed_pb2_grpc as pb_grpc
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.engine.policy import DraftLengthPolicy
from serving.engine.sampling import SamplingParams, make_sampler
from serving.errors import BadInputError, SpecOpsError
from serving.security.keys import client_key
from serving.security.tls import grpc_channel_credentials


class RemoteError(SpecOpsError):
    """A call the target server refused or could not finish."""

    def __init__(self, call: str, code: grpc.StatusCode | None, details: str) -> None:
        name = code.name if code is not None else "UNKNOWN"
        super().__init__(f"{call} failed: {name}: {details}")
        self.code = code
        self.details = details


@dataclass
class SessionResult:
    """One request decoded over the link, as the client saw it."""

    session_id: str
    token_ids: list[int]
    stop_reason: str
    steps: list[tuple[int, int]] = field(default_factory=list)  # (proposed, accepted)
    ttft_s: float = 0.0  # from the start call to the first output token in hand
    total_s: float = 0.0  # from the start call to the finalize reply
    draft_s: float = 0.0  # the client's drafting time
    round_trips: int = 0  # calls made (start, verifies, finalize; a stream counts once)
    pass_sessions: list[int] = field(default_factory=list)  # sessions in each step's pass
    prompt_tokens: int = 0

    @property
    def accepted_tokens(self) -> int:
        return sum(a for _, a in self.steps)

    @property
    def draft_tokens(self) -> int:
        return sum(p for p, _ in self.steps)


def _sampling(params: SamplingParams) -> pb.Sampling:
    message = pb.Sampling(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    if params.seed is not None:
        message.seed = params.seed
    return message


class TargetClient:
    """A connection to one target server. Thread-safe (gRPC channels are)."""

    def __init__(
        self,
        address: str,
        *,
        rtt_s: float = 0.0,
        timeout_s: float = 60.0,
        api_key: str | None = None,
        tls: bool = False,
        tls_ca: Path | None = None,
    ) -> None:
        """``api_key``: sent with every call (``authorization: Bearer``); None: the first of
        ``$SPECOPS_API_KEYS`` (:func:`~serving.security.keys.client_key`). ``tls``: a TLS
        channel that trusts the system's certificates, or those of the CA file ``tls_ca``
        (which implies ``tls``)."""
        if not rtt_s >= 0:
            raise BadInputError(f"rtt_s must be >= 0, got {rtt_s!r}")
        if not timeout_s > 0:
            raise BadInputError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.address = address
        self.rtt_s = float(rtt_s)
        self.timeout_s = float(timeout_s)
        key = client_key() if api_key is None else api_key
        # Metadata, not call credentials: grpcio sends those on TLS channels only, and a
        # loopback server may have keys without TLS.
        self.metadata = (("authorization", f"Bearer {key}"),)
        self.tls = tls or tls_ca is not None
        if self.tls:
            credentials = grpc_channel_credentials(tls_ca)
            self.channel = grpc.secure_channel(address, credentials)
        else:
            self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.TargetServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> TargetClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            handshake = " (or its TLS handshake failed: is it TLS, and is --tls-ca its CA?)"
            raise RemoteError(
                "connect",
                grpc.StatusCode.UNAVAILABLE,
                f"no target server at {self.address}{handshake if self.tls else ''}",
            ) from None

    def _call(self, name: str, request, timeout_s: float | None = None):
        half = self.rtt_s / 2
        if half:
            time.sleep(half)
        try:
            reply = getattr(self.stub, name)(
                request, timeout=timeout_s or self.timeout_s, metadata=self.metadata
            )
        except grpc.RpcError as error:
            raise RemoteError(name, error.code(), error.details() or "") from None
        if half:
            time.sleep(half)
        return reply

    # --- the protocol ----------------------------------------------------------------------
    def info(self) -> pb.InfoReply:
        return self._call("Info", pb.InfoRequest())

    def start(
        self,
        prompt: Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        server_drafter: str = "",
        policy: str = "",
        k: int = 0,
    ) -> pb.StartReply:
        request = pb.StartRequest(
            prompt_token_ids=list(prompt),
            sampling=_sampling(sampling or SamplingParams()),
            max_new_tokens=max_new_tokens,
            server_drafter=server_drafter,
            policy=policy,
            k=k,
        )
        return self._call("StartSession", request)

    def verify(self, session_id: str, drafts: Sequence[int]) -> pb.StepReply:
        request = pb.VerifyRequest(session_id=session_id, draft_token_ids=list(drafts))
        return self._call("Verify", request).step

    def verify_batch(self, blocks: Sequence[tuple[str, Sequence[int]]]) -> list[pb.StepReply]:
        request = pb.VerifyBatchRequest(
            blocks=[pb.VerifyRequest(session_id=s, draft_token_ids=list(d)) for s, d in blocks]
        )
        return list(self._call("VerifyBatch", request).steps)

    def generate(self, session_id: str, timeout_s: float | None = None) -> Iterator[pb.StepReply]:
        """A fused session's steps as the server makes them (delayed as the link says)."""
        half = self.rtt_s / 2
        if half:
            time.sleep(half)
        stream = self.stub.Generate(
            pb.GenerateRequest(session_id=session_id),
            timeout=timeout_s or self.timeout_s,
            metadata=self.metadata,
        )
        try:
            for message in stream:
                if half:
                    arrived = time.perf_counter()
                    # Each message is in hand half a round trip after it left the server.
                    time.sleep(max(0.0, arrived + half - time.perf_counter()))
                yield message
        except grpc.RpcError as error:
            raise RemoteError("Generate", error.code(), error.details() or "") from None
        finally:
            stream.cancel()

    def finalize(self, session_id: str) -> pb.FinalizeReply:
        return self._call("Finalize", pb.FinalizeRequest(session_id=session_id))


def check_client_drafter(drafter: Drafter | None) -> None:
    if drafter is not None and drafter.needs_target_hidden:
        raise BadInputError(
            f"drafter {drafter.describe().get('name')!r} reads the target's hidden states, "
            "which stay on the target server: run it fused (the server's drafter) instead"
        )


def run_distributed(
    client: TargetClient,
    prompt: Sequence[int],
    *,
    drafter: Drafter | None,
    policy: DraftLengthPolicy | None,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    max_block: int | None = None,
) -> SessionResult:
    """Decode ``prompt`` with ``drafter`` here and the target there: one verify per step.
    ``policy`` chooses each block's length and learns from the round trip's time (so a
    slow link makes a cost-aware policy draft longer). ``drafter`` ``None``: plain decoding
    over the link (a block of no drafts per step). ``max_block``: the server's limit on
    a block (``Info``); asked for here when not given, which costs a round trip."""
    check_client_drafter(drafter)
    if drafter is not None and policy is None:
        raise BadInputError("a drafter needs a draft-length policy (e.g. FixedK(4))")
    sampling = sampling or SamplingParams()
    sampler = make_sampler(sampling, device="cpu")
    limit = max_block or client.info().max_block
    started = time.perf_counter()
    session = client.start(prompt, max_new_tokens=max_new_tokens, sampling=sampling).session_id
    result = SessionResult(session, [], "", round_trips=1, prompt_tokens=len(prompt))
    tokens = list(prompt)
    try:
        if drafter is not None:
            drafter.begin(list(tokens))
            assert policy is not None
            policy.begin()
        while True:
            k = 0
            if drafter is not None and policy is not None:
                remaining = max_new_tokens - len(result.token_ids)
                k = max(0, min(policy.next_k(), remaining - 1, limit))
            drafted = time.perf_counter()
            proposal = (
                drafter.propose(DraftRequest(tokens, k, sampler)).truncate(k)
                if drafter is not None and k > 0
                else DraftProposal.empty()
            )
            sent = time.perf_counter()
            result.draft_s += sent - drafted
            step = client.verify(session, proposal.tokens.tolist())
            result.round_trips += 1
            new_tokens = list(step.new_token_ids)
            if drafter is not None and policy is not None:
                drafter.commit(
                    StepFeedback(
                        proposed=len(proposal),
                        accepted=step.accepted,
                        new_tokens=new_tokens,
                        tokens=tokens + new_tokens,
                    )
                )
                policy.update(
                    len(proposal),
                    step.accepted,
                    draft_s=sent - drafted,
                    verify_s=time.perf_counter() - sent,
                )
            tokens.extend(new_tokens)
            if step.emitted_token_ids and not result.token_ids:
                result.ttft_s = time.perf_counter() - started
            result.token_ids.extend(step.emitted_token_ids)
            result.steps.append((step.proposed, step.accepted))
            result.pass_sessions.append(step.pass_sessions)
            if step.finished:
                result.stop_reason = step.stop_reason
                break
    except BaseException:
        _abandon(client, session)
        raise
    finally:
        if drafter is not None:
            drafter.end()
    client.finalize(session)
    result.round_trips += 1
    result.total_s = time.perf_counter() - started
    return result


def run_fused(
    client: TargetClient,
    prompt: Sequence[int],
    *,
    server_drafter: str,
    policy: str = "fixed",
    k: int = 4,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
) -> SessionResult:
    """Decode ``prompt`` with drafter and target both on the server (``server_drafter`` a
    drafter spec, ``"none"`` for plain decoding), reading its steps as a stream."""
    started = time.perf_counter()
    session = client.start(
        prompt,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        server_drafter=server_drafter,
        policy=policy,
        k=k,
    ).session_id
    result = SessionResult(session, [], "", round_trips=2, prompt_tokens=len(prompt))
    try:
        for step in client.generate(session):
            if step.emitted_token_ids and not result.token_ids:
                result.ttft_s = time.perf_counter() - started
            result.token_ids.extend(step.emitted_token_ids)
            result.steps.append((step.proposed, step.accepted))
            result.pass_sessions.append(step.pass_sessions)
            if step.finished:
                result.stop_reason = step.stop_reason
    except BaseException:
        _abandon(client, session)
        raise
    client.finalize(session)
    result.round_trips += 1
    result.total_s = time.perf_counter() - started
    return result


def _abandon(client: TargetClient, session_id: str) -> None:
    """Free the server's state for a session this client gives up on (best effort: if the
    server cannot be reached, its idle timeout frees it)."""
    with contextlib.suppress(RemoteError):
        client.finalize(session_id)
