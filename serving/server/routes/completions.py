"""``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's completions, whole
or streamed as server-sent events; a chat with ``skeleton: true`` goes to
:mod:`serving.server.routes.skeleton`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from serving.errors import SpecOpsError
from serving.loader import encode_messages
from serving.server import runner
from serving.server.api_errors import bad_request
from serving.server.deps import ServerStateDep
from serving.server.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    SkeletonAnswer,
    TextChoice,
    answer_id,
)
from serving.server.routes import skeleton
from serving.server.schemas import ChatCompletionRequest, CompletionRequest
from serving.server.streaming import stream

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
    created = int(time.time())
    outcome = await runner.run(request, state, body, decode)
    return Completion(
        id=answer_id(chat=False),
        created=created,
        model=state.config.model_name,
        choices=[TextChoice(finish_reason=outcome.finish_reason, text=outcome.text)],
        usage=runner.usage(decode, outcome),
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
    created = int(time.time())
    outcome = await runner.run(request, state, body, decode)
    return ChatCompletion(
        id=answer_id(chat=True),
        created=created,
        model=state.config.model_name,
        choices=[
            ChatChoice(
                finish_reason=outcome.finish_reason,
                message=AssistantMessage(content=outcome.text),
            )
        ],
        usage=runner.usage(decode, outcome),
    )
