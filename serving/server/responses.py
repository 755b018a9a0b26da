"""The bodies the server answers with, one pydantic model each (OpenAI's shapes plus the
``speculative`` usage block and the skeleton report); the request bodies are in
``schemas.py``, errors keep the shared :func:`serving.security.asgi.error_body`.

Field order is the wire's key order (the ``openai`` client and the tests read these keys;
a ``None`` is sent as ``null``). Streamed chunks go out as ``data:`` lines through
:func:`sse`, with :func:`json.dumps`'s spacing, as they always have."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from serving.engine.metrics import RequestStats

FinishReason = Literal["stop", "length"]


class _Wire(BaseModel):
    # A field this module does not declare is a bug here, never something to pass along.
    model_config = ConfigDict(extra="forbid")


# --- usage -----------------------------------------------------------------------------------
class SpeculationStats(_Wire):
    """One request's speculation (formulas: serving/engine/metrics.py)."""

    draft_version: str  # the champion version, or the per-request drafter spec
    checks: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    mean_accepted_length: float | None
    acceptance_by_position: list[float | None]
    # Output token positions kept although the target disagreed (relax_lambda only).
    unverified_positions: list[int]

    @classmethod
    def of(
        cls, stats: RequestStats | None, *, draft_version: str, unverified: list[int]
    ) -> SpeculationStats:
        """From the engine's statistics (``None``: the request never reached a check)."""
        return cls(
            draft_version=draft_version,
            checks=stats.checks if stats else 0,
            draft_tokens=stats.draft_tokens if stats else 0,
            accepted_tokens=stats.accepted_tokens if stats else 0,
            acceptance_rate=stats.acceptance_rate if stats else None,
            mean_accepted_length=stats.mean_accepted_length if stats else None,
            acceptance_by_position=list(stats.acceptance_by_position) if stats else [],
            unverified_positions=list(unverified),
        )


class Usage(_Wire):
    """OpenAI's usage."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def counted(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class SpeculativeUsage(Usage):
    """OpenAI's usage plus the request's speculation (``usage.speculative``)."""

    speculative: SpeculationStats

    @classmethod
    def of(
        cls, prompt_tokens: int, completion_tokens: int, speculative: SpeculationStats
    ) -> SpeculativeUsage:
        counts = Usage.counted(prompt_tokens, completion_tokens)
        return cls(**counts.model_dump(), speculative=speculative)


# --- choices ---------------------------------------------------------------------------------
class TextChoice(_Wire):
    """A completion's choice, whole or as a streamed piece (``finish_reason`` null until
    the last)."""

    index: int = 0
    finish_reason: FinishReason | None
    text: str
    logprobs: None = None  # not supported; always null


class AssistantMessage(_Wire):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Wire):
    index: int = 0
    finish_reason: FinishReason | None
    message: AssistantMessage


class ChatDelta(_Wire):
    """What a chat chunk adds: the role on the first, text on the others, nothing on the
    last. Absent keys are left out, not sent as null (OpenAI's streaming shape)."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _present_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatChunkChoice(_Wire):
    index: int = 0
    finish_reason: FinishReason | None
    delta: ChatDelta


# --- whole answers ---------------------------------------------------------------------------
def answer_id(*, chat: bool) -> str:
    """A new answer's ``id`` (a stream's chunks share one)."""
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


class _Answer(_Wire):
    id: str  # "cmpl-..." or "chatcmpl-...", the same on every chunk of a stream
    object: str
    created: int  # Unix seconds
    model: str


class Completion(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]
    usage: SpeculativeUsage


class ChatCompletion(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: SpeculativeUsage


class SkeletonReport(_Wire):
    plan: str  # the constrained plan as decoded
    direct: bool  # the plan answered directly (no points)
    points: list[str]
    # Points (1-based; the direct answer is 1) that hit max_tokens: reported, not cut
    # silently.
    truncated: list[int]


class SkeletonAnswer(_Answer):
    """A skeleton-of-thought chat answer: its usage sums the plan and every point, and has
    no ``speculative`` block (the requests it sums ran separately)."""

    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    skeleton: SkeletonReport


# --- streamed chunks -------------------------------------------------------------------------
class CompletionChunk(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]


class ChatCompletionChunk(_Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class UsageChunk(_Answer):
    """The last chunk of a stream that asked for usage (``stream_options.include_usage``):
    no choice, the usage."""

    object: Literal["text_completion", "chat.completion.chunk"]
    choices: tuple[()] = ()
    usage: SpeculativeUsage


def sse(chunk: BaseModel | dict[str, object]) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    payload = chunk.model_dump(mode="json") if isinstance(chunk, BaseModel) else chunk
    return f"data: {json.dumps(payload)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


# --- the server itself -----------------------------------------------------------------------
class DraftInfo(_Wire):
    """The serving draft (``LoadedDraft.describe()``)."""

    version: str
    source: str  # static, local, registry
    drafter: str  # its spec
    package: str | None  # the draft package folder, if it has one
    policy: str
    k: int
    loaded_at: float  # Unix seconds


class Health(_Wire):
    status: Literal["ok"] = "ok"
    model: str
    hardware: str
    draft: DraftInfo
    draft_swaps: int
    champion_error: str | None  # why the last champion poll failed (None: it did not)
    requests_running: int
    requests_waiting: int


class ModelCard(_Wire):
    id: str
    object: Literal["model"] = "model"
    created: int  # when the serving draft loaded (Unix seconds)
    owned_by: Literal["specops"] = "specops"
    max_model_len: int
    draft: DraftInfo


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]
