"""``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's completions, whole
or streamed as server-sent events; a chat with ``skeleton: true`` goes to
:mod:`serving.server.routes.skeleton`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from serving.errors import SpecOpsError
from serving.loader import encode_messages
from serving.server import runner
from serving.server.api_errors import APIError, bad_request
from serving.server.deps import ServerStateDep
from serving.server.responses import (
    SSE_DONE,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChunk,
    FinishReason,
    SkeletonAnswer,
    SpeculationStats,
    SpeculativeUsage,
    TextChoice,
    UsageChunk,
    answer_id,
    sse,
)
from serving.server.routes import skeleton
from serving.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    SpecOpsFields,
    error_body,
)
from serving.server.state import Decode, ServerState

router = APIRouter()

# What a completion without max_tokens generates (OpenAI's default for completions).
COMPLETION_DEFAULT_MAX_TOKENS = 16


@router.post("/v1/completions", response_model=Completion)
async def completions(request: Request, state: ServerStateDep) -> Completion | StreamingResponse:
    body = await runner.parse(request, state, CompletionRequest)
    assert isinstance(body.prompt, str)  # validation keeps one prompt
    prompt_ids = list(state.tokenizer(body.prompt, add_special_tokens=False)["input_ids"])  # type: ignore[operator]
    decode = runner.new_decode(
        state,
        body,
        prompt_ids,
        default_max=COMPLETION_DEFAULT_MAX_TOKENS,
        capture=runner.consents(request, state, body),
    )
    if body.stream:
        return stream(request, state, body, decode, chat=False)
    outcome = await runner.run(request, state, body, decode)
    return Completion(
        id=answer_id(chat=False),
        created=int(time.time()),
        model=state.config.model_name,
        choices=[TextChoice(finish_reason=outcome.finish_reason, text=outcome.text)],
        usage=usage(decode, outcome),
    )


@router.post("/v1/chat/completions", response_model=ChatCompletion | SkeletonAnswer)
async def chat_completions(
    request: Request, state: ServerStateDep
) -> ChatCompletion | SkeletonAnswer | StreamingResponse:
    body = await runner.parse(request, state, ChatCompletionRequest)
    try:
        prompt_ids = encode_messages(state.tokenizer, body.as_template_messages())
    except SpecOpsError as error:
        raise bad_request(str(error), "messages") from None
    # Without max_tokens a chat may fill the context (up to the server's limit).
    default_max = max(1, min(state.config.limits.max_tokens, state.max_context - len(prompt_ids)))
    if body.skeleton:
        return await skeleton.answer(request, state, body, default_max)
    decode = runner.new_decode(
        state,
        body,
        prompt_ids,
        default_max=default_max,
        capture=runner.consents(request, state, body),
    )
    if body.stream:
        return stream(request, state, body, decode, chat=True)
    outcome = await runner.run(request, state, body, decode)
    return ChatCompletion(
        id=answer_id(chat=True),
        created=int(time.time()),
        model=state.config.model_name,
        choices=[
            ChatChoice(
                finish_reason=outcome.finish_reason,
                message=AssistantMessage(content=outcome.text),
            )
        ],
        usage=usage(decode, outcome),
    )


def usage(decode: Decode, outcome: runner.Outcome) -> SpeculativeUsage:
    """OpenAI's usage, plus the request's speculation statistics (serving.metrics)."""
    speculative = SpeculationStats.of(
        outcome.stats, draft_version=decode.draft_version, unverified=outcome.unverified
    )
    return SpeculativeUsage.of(len(decode.prompt_ids), len(outcome.token_ids), speculative)


@dataclass(frozen=True)
class _Chunks:
    """The chunks of one stream: each carries the stream's id, time and model."""

    id: str
    created: int
    model: str
    chat: bool

    def first(self) -> str | None:
        """A chat stream opens with the assistant's role; a completion has no opener."""
        if not self.chat:
            return None
        return self._chat(ChatDelta(role="assistant", content=""), None)

    def piece(self, text: str) -> str:
        if self.chat:
            return self._chat(ChatDelta(content=text), None)
        return self._text(text, None)

    def last(self, finish_reason: FinishReason | None) -> str:
        """The finish reason, with no text (a chat's delta is empty)."""
        if self.chat:
            return self._chat(ChatDelta(), finish_reason)
        return self._text("", finish_reason)

    def usage(self, usage: SpeculativeUsage) -> str:
        return sse(
            UsageChunk(
                id=self.id,
                object="chat.completion.chunk" if self.chat else "text_completion",
                created=self.created,
                model=self.model,
                usage=usage,
            )
        )

    def _chat(self, delta: ChatDelta, finish_reason: FinishReason | None) -> str:
        choice = ChatChunkChoice(finish_reason=finish_reason, delta=delta)
        return sse(
            ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[choice]
            )
        )

    def _text(self, text: str, finish_reason: FinishReason | None) -> str:
        choice = TextChoice(finish_reason=finish_reason, text=text)
        return sse(
            CompletionChunk(id=self.id, created=self.created, model=self.model, choices=[choice])
        )


def stream(
    request: Request, state: ServerState, body: SpecOpsFields, decode: Decode, *, chat: bool
) -> StreamingResponse:
    """The request as server-sent events: text as it becomes final, then the finish
    reason, the usage (if asked) and ``[DONE]``; a failure mid-stream is an error event."""
    chunks = _Chunks(answer_id(chat=chat), int(time.time()), state.config.model_name, chat)
    return StreamingResponse(
        _events(request, state, body, decode, chunks), media_type="text/event-stream"
    )


async def _events(
    request: Request, state: ServerState, body: SpecOpsFields, decode: Decode, chunks: _Chunks
) -> AsyncIterator[str]:
    pieces: asyncio.Queue[str | None] = asyncio.Queue()

    async def on_text(delta: str) -> None:
        await pieces.put(chunks.piece(delta))

    opener = chunks.first()
    if opener is not None:
        yield opener
    runner_task = asyncio.create_task(runner.run(request, state, body, decode, on_text))
    runner_task.add_done_callback(lambda _: pieces.put_nowait(None))
    try:
        while (piece := await pieces.get()) is not None:
            yield piece
        try:
            outcome = runner_task.result()
        except APIError as error:
            state.metrics.error(error.status)
            yield sse(error_body(error.message, kind=error.kind))
            return
        yield chunks.last(outcome.finish_reason)
        if body.include_usage:
            yield chunks.usage(usage(decode, outcome))
        yield SSE_DONE
    finally:
        if not runner_task.done():
            runner_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, APIError):
                await runner_task
