"""A completion streamed as server-sent events: text as it becomes final, then the finish
reason, the usage (if asked) and ``[DONE]``; a failure mid-stream is an error event (the
status line has gone already). The chunks are the models of ``responses.py``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import StreamingResponse

from serving.server import runner
from serving.server.api_errors import APIError
from serving.server.responses import (
    SSE_DONE,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChunk,
    FinishReason,
    SpeculativeUsage,
    TextChoice,
    UsageChunk,
    answer_id,
    sse,
)
from serving.server.schemas import SpecOpsFields, error_body
from serving.server.state import Decode, ServerState


def stream(
    request: Request, state: ServerState, body: SpecOpsFields, decode: Decode, *, chat: bool
) -> StreamingResponse:
    """The response that streams ``decode`` (a chat's chunks or a completion's)."""
    chunks = StreamChunks(answer_id(chat=chat), int(time.time()), state.config.model_name, chat)
    return StreamingResponse(
        events(request, state, body, decode, chunks), media_type="text/event-stream"
    )


async def events(
    request: Request, state: ServerState, body: SpecOpsFields, decode: Decode, chunks: StreamChunks
) -> AsyncIterator[str]:
    """Run the request beside the stream; closing the stream (a client gone) cancels it."""
    pieces: asyncio.Queue[str | None] = asyncio.Queue()

    async def on_text(delta: str) -> None:
        await pieces.put(chunks.piece(delta))

    opener = chunks.first()
    if opener is not None:
        yield opener
    running = asyncio.create_task(runner.run(request, state, body, decode, on_text))
    running.add_done_callback(lambda _: pieces.put_nowait(None))
    try:
        while (piece := await pieces.get()) is not None:
            yield piece
        try:
            outcome = running.result()
        except APIError as error:
            state.metrics.error(error.status)
            yield sse(error_body(error.message, kind=error.kind))
            return
        yield chunks.last(outcome.finish_reason)
        if body.include_usage:
            yield chunks.usage(runner.usage(decode, outcome))
        yield SSE_DONE
    finally:
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, APIError):
                await running


@dataclass(frozen=True)
class StreamChunks:
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
