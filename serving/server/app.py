"""The OpenAI-compatible HTTP app (FastAPI): completions, chat completions, models, health,
Prometheus metrics. Decoding happens on the scheduler's worker thread; each request waits
on its own asyncio queue of events, so the event loop never runs a model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from serving.errors import BadInputError, SpecOpsError
from serving.loader import encode_messages
from serving.metrics import RequestStats
from serving.sampling import SamplingParams
from serving.security.asgi import ApiKeyGuard, BodyLimit
from serving.security.consent import CAPTURE_HEADER, header_consent
from serving.server.scheduler import Job, QueueFullError, SchedulerClosedError
from serving.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    SpecOpsFields,
    error_body,
    prompt_chars,
)
from serving.server.state import Decode, ServerState
from serving.server.text import TextAssembler
from serving.skeleton.decode import skeleton_budget
from serving.skeleton.parse import parse_skeleton
from serving.skeleton.prompts import branch_messages, merge, skeleton_messages

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, kind: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


def _bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, kind="invalid_request_error", param=param)


@dataclass
class _Outcome:
    """What the handler saw of one request."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RequestStats | None = None
    unverified: list[int] = field(default_factory=list)  # relaxed mode's kept disagreements
    steps: list = field(default_factory=list)
    first_token_s: float | None = None


def usage(prompt_tokens: int, outcome: _Outcome, draft_version: str) -> dict[str, object]:
    """OpenAI's usage, plus the request's speculation statistics (serving.metrics)."""
    completion = len(outcome.token_ids)
    stats = outcome.stats
    speculative = {
        "draft_version": draft_version,
        "checks": stats.checks if stats else 0,
        "draft_tokens": stats.draft_tokens if stats else 0,
        "accepted_tokens": stats.accepted_tokens if stats else 0,
        "acceptance_rate": stats.acceptance_rate if stats else None,
        "mean_accepted_length": stats.mean_accepted_length if stats else None,
        "acceptance_by_position": stats.acceptance_by_position if stats else [],
        # Output token positions kept although the target disagreed (relax_lambda only).
        "unverified_positions": list(outcome.unverified),
    }
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "speculative": speculative,
    }


def create_app(state: ServerState) -> FastAPI:
    config = state.config
    metrics = state.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.scheduler.start()
        background = [asyncio.create_task(_housekeeping())]
        try:
            yield
        finally:
            for task in background:
                task.cancel()
            await asyncio.to_thread(state.scheduler.stop)
            state.capture.flush()

    async def _housekeeping() -> None:
        """Poll the champion source, flush old captures, refresh the queue gauges."""
        next_poll = time.monotonic() + config.champion.poll_s
        next_predictor_poll = time.monotonic() + config.cascade.poll_s
        while True:
            await asyncio.sleep(0.5)
            try:
                metrics.set_queue(running=state.scheduler.running, waiting=state.scheduler.waiting)
                await asyncio.to_thread(state.capture.flush_if_old)
                if config.champion.source != "static" and time.monotonic() >= next_poll:
                    swapped = await asyncio.to_thread(state.watcher.poll)
                    next_poll = time.monotonic() + config.champion.poll_s
                    if swapped:
                        current = state.watcher.current
                        metrics.labels(metrics.swaps).inc()
                        metrics.set_draft(current.ref.version, str(current.spec))
                if state.predictors is not None and time.monotonic() >= next_predictor_poll:
                    await asyncio.to_thread(state.predictors.poll)
                    next_predictor_poll = time.monotonic() + config.cascade.poll_s
            except Exception:  # housekeeping must outlive any one failure
                log.exception("server housekeeping failed; retrying")

    app = FastAPI(title="specops", lifespan=lifespan)

    def rejected(status: int, reason: str) -> None:
        metrics.error(status)
        metrics.labels(metrics.rejected, reason=reason).inc()

    # Outermost first: the key is checked before a byte of the body is read.
    app.add_middleware(BodyLimit, max_bytes=config.limits.max_body_bytes, on_reject=rejected)
    open_paths = {"/health", *(("/metrics",) if config.security.metrics_open else ())}
    app.add_middleware(ApiKeyGuard, keys=state.api_keys, open_paths=open_paths, on_reject=rejected)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        metrics.error(error.status)
        return JSONResponse(
            error_body(error.message, kind=error.kind, param=error.param), status_code=error.status
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error in %s", request.url.path)
        metrics.error(500)
        return JSONResponse(
            error_body(f"internal error: {type(error).__name__}: {error}", kind="server_error"),
            status_code=500,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        metrics.error(400)
        problems = []
        param = None
        for item in error.errors():
            where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
            param = param or where or None
            problems.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
        return JSONResponse(
            error_body("; ".join(problems), kind="invalid_request_error", param=param),
            status_code=400,
        )

    @app.get("/health")
    async def health() -> dict[str, object]:
        watcher = state.watcher
        return {
            "status": "ok",
            "model": config.model_name,
            "hardware": config.hardware,
            "draft": watcher.current.describe(),
            "draft_swaps": watcher.swaps,
            "champion_error": watcher.last_error,
            "requests_running": state.scheduler.running,
            "requests_waiting": state.scheduler.waiting,
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.set_queue(running=state.scheduler.running, waiting=state.scheduler.waiting)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {
            "object": "list",
            "data": [
                {
                    "id": config.model_name,
                    "object": "model",
                    "created": int(state.watcher.current.loaded_at),
                    "owned_by": "specops",
                    "max_model_len": state.max_context,
                    "draft": state.watcher.current.describe(),
                }
            ],
        }

    def _consents(request: Request, body: SpecOpsFields) -> bool:
        """Whether this request may be captured: not when the body says ``capture: false``
        (or ``store: false``) or the header ``X-SpecOps-Capture`` says off."""
        try:
            header = header_consent(request.headers.get(CAPTURE_HEADER))
        except BadInputError as error:
            raise _bad_request(str(error), CAPTURE_HEADER) from None
        opted_out = body.opted_out or header is False
        if opted_out:
            metrics.labels(metrics.capture_opt_outs).inc()
        return not opted_out

    async def _parse(request: Request, model: type[SpecOpsFields]) -> SpecOpsFields:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise _bad_request(f"the body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise _bad_request(f"the body must be a JSON object, got {type(body).__name__}")
        try:
            parsed = model.model_validate(body)
        except ValidationError as error:
            raise RequestValidationError(error.errors()) from None
        limits = config.limits
        if isinstance(parsed, ChatCompletionRequest) and len(parsed.messages) > limits.max_messages:
            raise _bad_request(
                f"the request has {len(parsed.messages)} messages; this server takes at most "
                f"{limits.max_messages} (limits.max_messages)",
                "messages",
            )
        chars = prompt_chars(parsed)
        if chars > limits.max_prompt_chars:
            raise _bad_request(
                f"the prompt has {chars} characters; this server takes at most "
                f"{limits.max_prompt_chars} (limits.max_prompt_chars)",
                "messages" if isinstance(parsed, ChatCompletionRequest) else "prompt",
            )
        if parsed.model != config.model_name:
            raise APIError(
                404,
                f"The model `{parsed.model}` does not exist; this server serves "
                f"`{config.model_name}`",
                kind="NotFoundError",
                param="model",
            )
        return parsed

    def _decode(
        body: SpecOpsFields,
        prompt_ids: list[int],
        default_max: int,
        *,
        max_tokens: int | None = None,
        constraint=None,
        capture: bool = True,
    ) -> Decode:
        limit = config.limits.max_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens if body.max_tokens is not None else default_max
        if max_tokens > limit:
            raise _bad_request(
                f"max_tokens={max_tokens} is above this server's limit of {limit}", "max_tokens"
            )
        if len(prompt_ids) + max_tokens > state.max_context:
            raise _bad_request(
                f"the prompt has {len(prompt_ids)} tokens; with max_tokens={max_tokens} that "
                f"exceeds the model's context of {state.max_context} tokens",
                "max_tokens" if len(prompt_ids) < state.max_context else "prompt",
            )
        try:
            sampling = SamplingParams(
                temperature=body.temperature,
                top_k=max(body.top_k, 0),
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
            raise _bad_request(str(error)) from None

    def _submit(decode: Decode) -> tuple[Job, asyncio.Queue[tuple[str, object]]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, object]] = asyncio.Queue()

        def emit(kind: str, payload: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))

        job = Job(
            generation=decode.generation,
            emit=emit,
            deadline=time.monotonic() + config.limits.request_timeout_s,
        )
        try:
            state.scheduler.submit(job)
        except QueueFullError as error:
            raise APIError(429, str(error), kind="rate_limit_error") from None
        except SchedulerClosedError as error:
            raise APIError(503, str(error), kind="service_unavailable") from None
        return job, queue

    async def _run(request: Request, body: SpecOpsFields, decode: Decode, on_text):
        """Drive one request; ``on_text(delta)`` receives the text as it becomes final.
        Returns the outcome. Raises :class:`APIError` for timeouts and failures. If the
        client goes away (or this coroutine is cancelled) the request is cancelled."""
        started = time.monotonic()
        outcome = _Outcome()
        assembler = TextAssembler(state.tokenizer, body.stops)
        job, queue = _submit(decode)
        ended = False
        try:
            while True:
                try:
                    kind, payload = await asyncio.wait_for(queue.get(), timeout=1.0)
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
                        f"the request did not finish within {config.limits.request_timeout_s:g} s",
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
        metrics.finished(
            finished_reason=outcome.finish_reason,
            prompt_tokens=len(decode.prompt_ids),
            steps=outcome.steps,
            generated=len(outcome.token_ids),
            e2e_s=time.monotonic() - started,
            queue_s=max(queue_s, 0.0),
            ttft_s=outcome.first_token_s,
        )
        if decode.detailed and result.record is not None and result.stop_reason != "cancelled":
            prompt_text = getattr(body, "prompt", None) or _last_user_text(body)
            captured = await asyncio.to_thread(  # redaction tokenises: off the event loop
                state.capture.add,
                result.record,
                prompt_text=prompt_text,
                output_text=outcome.text,
                drafter_version=decode.draft_version,
            )
            if captured:
                metrics.labels(metrics.captured).inc()
        return outcome

    def _last_user_text(body: SpecOpsFields) -> str:
        assert isinstance(body, ChatCompletionRequest)
        users = [m.text() for m in body.messages if m.role == "user"]
        return users[-1] if users else body.messages[-1].text()

    async def _respond(request: Request, body: SpecOpsFields, decode: Decode, *, chat: bool):
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        if not body.stream:

            async def ignore(delta: str) -> None:
                return None

            outcome = await _run(request, body, decode, ignore)
            choice: dict[str, object] = {"index": 0, "finish_reason": outcome.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": outcome.text}
            else:
                choice["text"] = outcome.text
                choice["logprobs"] = None
            return {
                "id": request_id,
                "object": kind,
                "created": created,
                "model": config.model_name,
                "choices": [choice],
                "usage": usage(len(decode.prompt_ids), outcome, decode.draft_version),
            }

        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, finish: str | None, *, first: bool = False) -> str:
            choice: dict[str, object] = {"index": 0, "finish_reason": finish}
            if chat:
                message: dict[str, object] = {}
                if first:
                    message["role"] = "assistant"
                if delta is not None:
                    message["content"] = delta
                choice["delta"] = message
            else:
                choice["text"] = delta or ""
                choice["logprobs"] = None
            payload = {
                "id": request_id,
                "object": chunk_kind,
                "created": created,
                "model": config.model_name,
                "choices": [choice],
            }
            return f"data: {json.dumps(payload)}\n\n"

        async def stream() -> AsyncIterator[str]:
            pieces: asyncio.Queue[str | None] = asyncio.Queue()

            async def on_text(delta: str) -> None:
                await pieces.put(chunk(delta, None))

            if chat:
                yield chunk("", None, first=True)
            runner = asyncio.create_task(_run(request, body, decode, on_text))
            runner.add_done_callback(lambda _: pieces.put_nowait(None))
            try:
                while (piece := await pieces.get()) is not None:
                    yield piece
                try:
                    outcome = runner.result()
                except APIError as error:
                    metrics.error(error.status)
                    body_ = error_body(error.message, kind=error.kind)
                    yield f"data: {json.dumps(body_)}\n\n"
                    return
                yield chunk(None if chat else "", outcome.finish_reason)
                if body.include_usage:
                    final = {
                        "id": request_id,
                        "object": chunk_kind,
                        "created": created,
                        "model": config.model_name,
                        "choices": [],
                        "usage": usage(len(decode.prompt_ids), outcome, decode.draft_version),
                    }
                    yield f"data: {json.dumps(final)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not runner.done():
                    runner.cancel()
                    with contextlib.suppress(asyncio.CancelledError, APIError):
                        await runner

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionRequest)
        assert isinstance(body, CompletionRequest)
        assert isinstance(body.prompt, str)
        prompt_ids = list(state.tokenizer(body.prompt, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
        decode = _decode(body, prompt_ids, default_max=16, capture=_consents(request, body))
        return await _respond(request, body, decode, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _parse(request, ChatCompletionRequest)
        assert isinstance(body, ChatCompletionRequest)
        try:
            prompt_ids = encode_messages(state.tokenizer, body.as_template_messages())
        except SpecOpsError as error:
            raise _bad_request(str(error), "messages") from None
        default_max = max(1, min(config.limits.max_tokens, state.max_context - len(prompt_ids)))
        if body.skeleton:
            return await _skeleton(request, body, default_max)
        decode = _decode(
            body, prompt_ids, default_max=default_max, capture=_consents(request, body)
        )
        return await _respond(request, body, decode, chat=True)

    async def _skeleton(request: Request, body: ChatCompletionRequest, default_max: int):
        """Skeleton-of-thought through the scheduler: the constrained plan is one request;
        its points are submitted together, so they ride the same packed passes."""
        if body.stream:
            raise _bad_request(
                "skeleton answers are not streamed (their points finish out of order); "
                "set stream to false",
                "stream",
            )

        async def ignore(delta: str) -> None:
            return None

        question = _last_user_text(body)
        constraint = await asyncio.to_thread(state.skeleton_constraint)
        try:
            plan_ids = encode_messages(state.tokenizer, skeleton_messages(question, constraint.fmt))
        except SpecOpsError as error:
            raise _bad_request(str(error), "messages") from None
        budget = min(skeleton_budget(constraint), config.limits.max_tokens)
        plan_decode = _decode(
            body, plan_ids, budget, max_tokens=budget, constraint=constraint, capture=False
        )
        # The user's stop sequences end the answer, not the plan.
        plan = await _run(request, body.model_copy(update={"stop": []}), plan_decode, ignore)
        try:
            skeleton = parse_skeleton(plan.text, constraint.fmt)
        except SpecOpsError as error:  # only a plan cut by the token limit gets here
            raise APIError(
                500, f"the skeleton did not complete: {error}", kind="server_error"
            ) from None
        if skeleton.direct:
            messages = body.as_template_messages()
            prompts = [encode_messages(state.tokenizer, messages)]
        else:
            prompts = [
                encode_messages(state.tokenizer, branch_messages(question, skeleton, i))
                for i in range(len(skeleton.points))
            ]
        decodes = [_decode(body, ids, default_max, capture=False) for ids in prompts]
        outcomes = await asyncio.gather(*(_run(request, body, d, ignore) for d in decodes))
        text = outcomes[0].text if skeleton.direct else merge(skeleton, [o.text for o in outcomes])
        cut = [i + 1 for i, o in enumerate(outcomes) if o.finish_reason == "length"]
        completion = len(plan.token_ids) + sum(len(o.token_ids) for o in outcomes)
        prompt_tokens = len(plan_decode.prompt_ids) + sum(len(d.prompt_ids) for d in decodes)
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": config.model_name,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length" if cut else "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            },
            "skeleton": {
                "plan": plan.text,
                "direct": skeleton.direct,
                "points": skeleton.points,
                # Points (1-based; the direct answer is 1) that hit max_tokens: reported,
                # not cut silently.
                "truncated": cut,
            },
        }

    return app
