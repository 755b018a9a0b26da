"""A chat with ``skeleton: true``: skeleton-of-thought through the scheduler. The
constrained plan is one request; its points are submitted together, so they ride the same
packed passes; the answer merges them (docs/skeleton.md)."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request

from serving.errors import SpecOpsError
from serving.loader import encode_messages
from serving.server import runner
from serving.server.api_errors import APIError, bad_request
from serving.server.responses import (
    AssistantMessage,
    ChatChoice,
    SkeletonAnswer,
    SkeletonReport,
    Usage,
    answer_id,
)
from serving.server.schemas import ChatCompletionRequest
from serving.server.state import ServerState
from serving.skeleton.decode import skeleton_budget
from serving.skeleton.parse import parse_skeleton
from serving.skeleton.prompts import branch_messages, merge, skeleton_messages


async def answer(
    request: Request, state: ServerState, body: ChatCompletionRequest, default_max: int
) -> SkeletonAnswer:
    if body.stream:
        raise bad_request(
            "skeleton answers are not streamed (their points finish out of order); "
            "set stream to false",
            "stream",
        )
    question = runner.last_user_text(body)
    constraint = await asyncio.to_thread(state.skeleton_constraint)
    try:
        plan_ids = encode_messages(state.tokenizer, skeleton_messages(question, constraint.fmt))
    except SpecOpsError as error:
        raise bad_request(str(error), "messages") from None
    budget = min(skeleton_budget(constraint), state.config.limits.max_tokens)
    plan_decode = runner.new_decode(
        state, body, plan_ids, budget, max_tokens=budget, constraint=constraint, capture=False
    )
    # The user's stop sequences end the answer, not the plan.
    plan = await runner.run(request, state, body.model_copy(update={"stop": []}), plan_decode)
    try:
        skeleton = parse_skeleton(plan.text, constraint.fmt)
    except SpecOpsError as error:  # only a plan cut by the token limit gets here
        raise APIError(
            500, f"the skeleton did not complete: {error}", kind="server_error"
        ) from None
    if skeleton.direct:
        prompts = [encode_messages(state.tokenizer, body.as_template_messages())]
    else:
        prompts = [
            encode_messages(state.tokenizer, branch_messages(question, skeleton, i))
            for i in range(len(skeleton.points))
        ]
    decodes = [runner.new_decode(state, body, ids, default_max, capture=False) for ids in prompts]
    outcomes = await asyncio.gather(*(runner.run(request, state, body, d) for d in decodes))
    text = outcomes[0].text if skeleton.direct else merge(skeleton, [o.text for o in outcomes])
    cut = [i + 1 for i, o in enumerate(outcomes) if o.finish_reason == "length"]
    completion = len(plan.token_ids) + sum(len(o.token_ids) for o in outcomes)
    prompt_tokens = len(plan_decode.prompt_ids) + sum(len(d.prompt_ids) for d in decodes)
    return SkeletonAnswer(
        id=answer_id(chat=True),
        created=int(time.time()),
        model=state.config.model_name,
        choices=[
            ChatChoice(
                finish_reason="length" if cut else "stop",
                message=AssistantMessage(content=text),
            )
        ],
        usage=Usage.counted(prompt_tokens, completion),
        skeleton=SkeletonReport(
            plan=plan.text, direct=skeleton.direct, points=skeleton.points, truncated=cut
        ),
    )
