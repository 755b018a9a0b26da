"""One request from its body to its outcome: parse and check it, build its decode, submit
it to the scheduler and follow its events to the end (capture included). Decoding happens
on the scheduler's worker thread; each request waits on its own asyncio queue of events,
so the event loop never runs a model. The routes shape the outcome into a response."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from serving.engine.constrained import Constraint
from serving.engine.metrics import RequestStats
from serving.engine.sampling import SamplingParams
from serving.errors import BadInputError, SpecOpsError
from serving.security.body import BodyError, parse_object
from serving.security.consent import CAPTURE_HEADER, header_consent
from serving.server.api_errors import APIError, bad_request, too_many
from serving.server.responses import FinishReason, SpeculationStats, SpeculativeUsage
from serving.server.scheduler import Job, QueueFullError, SchedulerClosedError
from serving.server.schemas import ChatCompletionRequest, SpecOpsFields, prompt_chars
from serving.server.state import Decode, ServerState
from serving.server.text import TextAssembler

Body = TypeVar("Body", bound=SpecOpsFields)
OnText = Callable[[str], Awaitable[None]]  # receives text as it becomes final
Events = asyncio.Queue[tuple[str, object]]  # (kind, payload) from the worker thread


@dataclass
class Outcome:
    """What the handler saw of one request."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None
    unverified: list[int] = field(default_factory=list)  # relaxed mode's kept disagreements
    steps: list = field(default_factory=list)
    first_token_s: float | None = None


async def parse(request: Request, state: ServerState, model: type[Body]) -> Body:
    """The body as ``model``, within the server's limits and naming its model; a bad one
    raises :class:`APIError` (or FastAPI's validation error, answered as a 400)."""
    config = state.config
    limits = config.limits
    try:
        raw = parse_object(await request.body(), max_depth=limits.max_json_depth)
    except BodyError as error:
        raise bad_request(str(error)) from None
    try:
        body = model.model_validate(raw)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None
    if isinstance(body, ChatCompletionRequest) and len(body.messages) > limits.max_messages:
        raise bad_request(
            f"the request has {len(body.messages)} messages; this server takes at most "
            f"{limits.max_messages} (limits.max_messages)",
            "messages",
        )
    chars = prompt_chars(body)
    if chars > limits.max_prompt_chars:
        raise bad_request(
            f"the prompt has {chars} characters; this server takes at most "
            f"{limits.max_prompt_chars} (limits.max_prompt_chars)",
            "messages" if isinstance(body, ChatCompletionRequest) else "prompt",
        )
    if body.model != config.model_name:
        raise APIError(
            404,
            f"The model `{body.model}` does not exist; this server serves `{config.model_name}`",
            kind="NotFoundError",
            param="model",
        )
    return body


def consents(request: Request, state: ServerState, body: SpecOpsFields) -> bool:
    """Whether this request may be captured: not when the body says ``capture: false``
    (or ``store: false``) or the header ``X-SpecOps-Capture`` says off."""
    try:
        header = header_consent(request.headers.get(CAPTURE_HEADER))
    except BadInputError as error:
        raise bad_request(str(error), CAPTURE_HEADER) from None
    opted_out = body.opted_out or header is False
    if opted_out:
        state.metrics.labels(state.metrics.capture_opt_outs).inc()
    return not opted_out


def new_decode(
    state: ServerState,
    body: SpecOpsFields,
    prompt_ids: list[int],
    default_max: int,
    *,
    max_tokens: int | None = None,
    constraint: Constraint | None = None,
    capture: bool = True,
) -> Decode:
    """The request's decode (its own drafter, policy and sampler), checked against the
    server's limits and the model's context before any model work."""
    limit = state.config.limits.max_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens if body.max_tokens is not None else default_max
    if max_tokens > limit:
        raise bad_request(
            f"max_tokens={max_tokens} is above this server's limit of {limit}", "max_tokens"
        )
    if len(prompt_ids) + max_tokens > state.max_context:
        raise bad_request(
            f"the prompt has {len(prompt_ids)} tokens; with max_tokens={max_tokens} that "
            f"exceeds the model's context of {state.max_context} tokens",
            "max_tokens" if len(prompt_ids) < state.max_context else "prompt",
        )
    try:
        sampling = SamplingParams(
            temperature=body.temperature,
            top_k=max(body.top_k, 0),  # vLLM's -1 disables top-k, as 0 does here
            top_p=body.top_p,
            seed=body.seed,
        )
        return state.new_decode(
            prompt_ids,
            max_new_tokens=max_tokens,
            sampling=sampling,
            drafter=body.drafter,
            policy=body.draft_policy,
            k=body.num_speculative_tokens,
            relax_lambda=body.relax_lambda,
            constraint=constraint,
            capture=capture,
        )
    except SpecOpsError as error:
        raise bad_request(str(error)) from None


def submit(state: ServerState, decode: Decode) -> tuple[Job, Events]:
    """Queue the decode on the scheduler; its events arrive on the returned queue. A full
    queue is a 429 with ``Retry-After``, a closing server a 503."""
    loop = asyncio.get_running_loop()
    events: Events = asyncio.Queue()

    def emit(kind: str, payload: object) -> None:  # called on the worker thread
        loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

    job = Job(
        generation=decode.generation,
        emit=emit,
        deadline=time.monotonic() + state.config.limits.request_timeout_s,
    )
    try:
        state.scheduler.submit(job)
    except QueueFullError as error:
        raise too_many(str(error), error.retry_after_s) from None
    except SchedulerClosedError as error:
        raise APIError(503, str(error), kind="service_unavailable") from None
    return job, events


async def _ignore(delta: str) -> None:
    return None


async def run(
    request: Request,
    state: ServerState,
    body: SpecOpsFields,
    decode: Decode,
    on_text: OnText = _ignore,
) -> Outcome:
    """Drive one request; ``on_text(delta)`` receives the text as it becomes final.
    Returns the outcome. Raises :class:`APIError` for timeouts and failures. If the
    client goes away (or this coroutine is cancelled) the request is cancelled."""
    started = time.monotonic()
    outcome = Outcome()
    assembler = TextAssembler(state.tokenizer, body.stops)
    job, events = submit(state, decode)
    ended = False
    try:
        while True:
            try:
                kind, payload = await asyncio.wait_for(events.get(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancel("client disconnected")
                continue
            if kind == "token":
                if assembler.stopped:
                    continue  # past a stop sequence: the worker is closing the request
                if outcome.first_token_s is None:
                    outcome.first_token_s = time.monotonic() - started
                outcome.token_ids.append(payload.token_id)  # type: ignore[attr-defined]
                delta = assembler.add(payload.token_id)  # type: ignore[attr-defined]
                if delta:
                    await on_text(delta)
                if assembler.stopped:
                    job.cancel("stop")
                continue
            ended = True
            if kind == "done" or (kind == "cancelled" and payload == "stop"):
                break
            if kind == "error":
                raise APIError(500, f"decoding failed: {payload}", kind="server_error")
            if payload == "timeout":
                raise APIError(
                    504,
                    f"the request did not finish within "
                    f"{state.config.limits.request_timeout_s:g} s",
                    kind="timeout",
                )
            raise APIError(499, f"cancelled: {payload}", kind="cancelled")
    finally:
        if not ended:
            job.cancel("client disconnected")
    result = decode.generation.result
    assert result is not None
    tail = assembler.finish()
    if tail:
        await on_text(tail)
    outcome.text = assembler.text
    outcome.stats = result.stats
    outcome.steps = result.steps
    outcome.unverified = list(result.unverified)
    outcome.finish_reason = (
        "length" if result.stop_reason == "length" and not assembler.stopped else "stop"
    )
    queue_s = (job.started_at or started) - job.enqueued_at
    state.metrics.finished(
        finished_reason=outcome.finish_reason,
        prompt_tokens=len(decode.prompt_ids),
        steps=outcome.steps,
        generated=len(outcome.token_ids),
        e2e_s=time.monotonic() - started,
        queue_s=max(queue_s, 0.0),
        ttft_s=outcome.first_token_s,
    )
    if decode.detailed and result.record is not None and result.stop_reason != "cancelled":
        prompt_text = getattr(body, "prompt", None) or last_user_text(body)
        captured = await asyncio.to_thread(  # redaction tokenises: off the event loop
            state.capture.add,
            result.record,
            prompt_text=prompt_text,
            output_text=outcome.text,
            drafter_version=decode.draft_version,
        )
        if captured:
            state.metrics.labels(state.metrics.captured).inc()
    return outcome


def usage(decode: Decode, outcome: Outcome) -> SpeculativeUsage:
    """OpenAI's usage, plus the request's speculation statistics (serving.engine.metrics)."""
    speculative = SpeculationStats.of(
        outcome.stats, draft_version=decode.draft_version, unverified=outcome.unverified
    )
    return SpeculativeUsage.of(len(decode.prompt_ids), len(outcome.token_ids), speculative)


def last_user_text(body: SpecOpsFields) -> str:
    """A chat's question: its last user message (its last message if no user spoke)."""
    assert isinstance(body, ChatCompletionRequest)
    users = [m.text() for m in body.messages if m.role == "user"]
    return users[-1] if users else body.messages[-1].text()
