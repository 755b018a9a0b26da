"""A user's own traffic as a workload: a JSONL file of OpenAI-style chat-completion requests.

One request per line, the body a client sends to ``/v1/chat/completions``::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "model": "...", "max_tokens": 256, "temperature": 0.7, "id": "..."}

``messages`` is required: a non-empty list of ``system``, ``user`` and ``assistant`` turns
with string content, ending with a non-empty user turn (the turn the target answers).
``model``, ``max_tokens``, ``temperature`` and ``id`` are optional and type-checked; any
other OpenAI field is allowed and ignored. ``model``, ``max_tokens`` and ``temperature`` are
not used: the collection's own settings decide the target, the token budget and sampling,
so that every request of one collection is decoded alike. Blank lines are skipped.

Each request becomes a :class:`~tasks.data.prompts.Prompt` of workload ``live``
(:data:`serving.records.schema.LIVE_WORKLOAD`): a user's own traffic is live traffic, like
what the server captures. It is all in the ``train`` split, because which of it is held out
is decided once it is collected, by time (the newest share of it,
:func:`tasks.data.dataset.holdout_by_time`), not by a hash of its id. The whole
conversation is kept (system prompt and earlier turns included), so the target sees what
it would have seen when serving the request. A prompt's id is the request's ``id`` when it
has one, otherwise a hash of the request (and of how many identical requests came before
it, so a repeated request is a new prompt rather than a duplicate): the same file gives
the same ids in every run, which is what lets a re-run of a collection skip what it wrote.

A bad file fails whole, before any model work: every bad line is found, and one
:class:`~serving.errors.BadInputError` lists them as ``path:LINE: what is wrong`` (the
first :data:`MAX_REPORTED`, with the count), so one run shows everything to fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from serving.errors import BadInputError
from serving.records.schema import LIVE_WORKLOAD, record_id
from tasks.data.prompts import Prompt

MAX_REPORTED = 10  # bad lines listed in the error; the rest are counted

Role = Literal["system", "user", "assistant"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: StrictStr


class ChatRequest(BaseModel):
    """The fields of a chat-completion request that are read here; others are ignored."""

    model_config = ConfigDict(extra="ignore")

    messages: list[ChatMessage] = Field(min_length=1)
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | StrictInt | None = Field(None, ge=0)
    id: StrictStr | None = Field(None, min_length=1)


def read_chat_requests(path: Path | str) -> list[Prompt]:
    """The requests of the JSONL file at ``path``, in file order, as ``live`` prompts.

    Raises :class:`BadInputError` when the file cannot be read, or naming every bad line
    (up to :data:`MAX_REPORTED` of them, with the count) when any line is bad.
    """
    path = Path(path)
    try:
        raw_lines = path.read_bytes().splitlines()
    except OSError as error:
        raise BadInputError(
            f"cannot read chat requests file {str(path)!r}: {error.strerror or error}"
        ) from None
    prompts: list[Prompt] = []
    problems: list[str] = []
    first_line_of_id: dict[str, int] = {}
    seen_content: dict[str, int] = {}
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        request, problem = _parse_line(raw)
        if request is None:
            problems.append(f"{path}:{number}: {problem}")
            continue
        if request.id is not None:
            prompt_id = request.id
            if prompt_id in first_line_of_id:
                problems.append(
                    f"{path}:{number}: duplicate id {prompt_id!r} (first on line "
                    f"{first_line_of_id[prompt_id]}); give each request its own id"
                )
                continue
            first_line_of_id[prompt_id] = number
        else:
            content = json.dumps(json.loads(raw), sort_keys=True)
            repeat = seen_content.get(content, 0)
            seen_content[content] = repeat + 1
            prompt_id = record_id("chat-request", content, repeat)
        prompts.append(
            Prompt(
                id=prompt_id,
                workload=LIVE_WORKLOAD,
                messages=[{"role": m.role, "content": m.content} for m in request.messages],
                reference=None,
                split="train",
            )
        )
    if problems:
        listed = "\n".join(problems[:MAX_REPORTED])
        more = len(problems) - MAX_REPORTED
        raise BadInputError(
            f"{len(problems)} bad line(s) in chat requests file {str(path)!r} (one OpenAI "
            "chat-completion request per line, ending with the user's turn):\n"
            + listed
            + (f"\n... and {more} more" if more > 0 else "")
        )
    return prompts


def _parse_line(raw: bytes) -> tuple[ChatRequest | None, str]:
    """The request on one line, or ``None`` and what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except json.JSONDecodeError as error:
        return None, f"not JSON ({error.msg} at column {error.colno})"
    if not isinstance(data, dict):
        return None, f"not a JSON object (got {type(data).__name__})"
    try:
        request = ChatRequest.model_validate(data)
    except ValidationError as error:
        return None, "; ".join(_describe(e) for e in error.errors())
    last = request.messages[-1]
    if last.role != "user":
        return None, (
            f"the last message has role {last.role!r}; the conversation must end with the "
            "user's turn, the one to answer"
        )
    if not last.content.strip():
        return None, "the last (user) message is empty"
    return request, ""


def _describe(error) -> str:
    """One pydantic error as ``field.path: message``, with the bad value when it is short."""
    where = ".".join(str(part) for part in error["loc"]) or "request"
    text = f"{where}: {error['msg']}"
    value = error.get("input")
    if error["type"] != "missing" and isinstance(value, str | int | float | bool | None):
        shown = repr(value)
        text += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    return text
